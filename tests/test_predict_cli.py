"""``basin predict eval|fit``: JSON keys, saved models, help examples, clean errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from basin.predict.peak import RidgePeakPredictor
from basin.workload.io import write_workload
from basin.workload.records import Call, Session, Workload
from cli_helpers import run_basin as _run


@pytest.fixture
def toy_file(tmp_path: Path) -> Path:
    words = "parser cache crash django query index build config docs server".split()
    sessions = []
    for t in range(30):
        text = " ".join(words[(t * k) % len(words)] for k in range(1, 6 + t % 7))
        for r in range(2):
            first = 400 + 5 * len(text)
            out = int(3000 * math.exp(0.05 * t + 0.1 * r))
            sessions.append(Session(f"t{t}-{r}", (Call(first, first, 20), Call(first + 500, 480, out)),
                                    task_text=text))
    path = tmp_path / "toy.jsonl"
    write_workload(Workload("toy", tuple(sessions)), path)
    return path


def test_eval_json_has_the_documented_keys(capsys, toy_file) -> None:
    code, out, _ = _run(capsys, "predict", "eval", str(toy_file), "--json", "--folds", "5")
    assert code == 0
    d = json.loads(out)
    assert {"workload", "sessions", "spearman", "log_error_sd", "folds"} <= set(d)
    assert d["sessions"] == 60 and d["groups"] == 30 and d["folds"] == 5 and d["group_by"] == "task"
    assert -1 <= d["spearman"] <= 1 and d["log_error_sd"] > 0


def test_eval_table_and_ablation_flags(capsys, toy_file) -> None:
    code, out, _ = _run(capsys, "predict", "eval", str(toy_file), "--folds", "3")
    assert code == 0, out
    # Read as a reader asks: both protocols side by side under words, not a dump of keys.
    assert "held out by task" in out and "held out by session" in out
    assert "Spearman: prediction vs peak" in out and "point: peaks covered" in out
    assert "log_error_sd" not in out and "other_protocol" not in out
    code, out, _ = _run(capsys, "predict", "eval", str(toy_file), "--json", "--lengths-only", "--group-by", "session")
    d = json.loads(out)
    assert code == 0 and d["use_text"] is False and d["group_by"] == "session" and d["groups"] == 60


def test_fit_writes_a_model_the_predictor_spec_loads(capsys, toy_file, tmp_path) -> None:
    model = tmp_path / "models" / "toy.joblib"
    code, out, _ = _run(capsys, "predict", "fit", str(toy_file), "--out", str(model), "--json", "--folds", "4")
    assert code == 0 and model.is_file()
    meta = json.loads(out)
    assert meta["workload"] == "toy" and meta["folds"] == 4 and meta["path"] == str(model)
    loaded = RidgePeakPredictor.load(model)
    assert loaded.predict_peak_tokens("parser cache", 600, "new", None) > 0


def test_fit_defaults_to_the_cache(capsys, toy_file, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = _run(capsys, "predict", "fit", str(toy_file))
    assert code == 0 and "will load" in out
    assert len(list((tmp_path / "cache" / "predict").glob("toy-*.joblib"))) == 1


@pytest.mark.parametrize("sub", ["eval", "fit"])
def test_help_has_an_example(capsys, sub: str) -> None:
    code, out, _ = _run(capsys, "predict", sub, "--help")
    assert code == 0 and "Example" in out and f"basin predict {sub}" in out


@pytest.mark.parametrize("args, message", [
    (["predict", "eval", "no-such-workload"], "unknown workload"),
    (["predict", "eval", "{toy}", "--folds", "1"], "field 'folds'"),
    (["predict", "eval", "{toy}", "--fold-seed", "-3"], "field 'fold_seed'"),
    (["predict", "fit", "{toy}", "--out", "{dir}"], "is a directory"),
])
def test_bad_input_exits_2_with_a_message(capsys, toy_file, tmp_path, args: list[str], message: str) -> None:
    args = [a.format(toy=toy_file, dir=tmp_path) for a in args]
    code, _, err = _run(capsys, *args)
    assert code == 2 and message in err


def test_eval_reports_both_protocols_and_the_quantile(capsys, toy_file) -> None:
    code, out, _ = _run(capsys, "predict", "eval", str(toy_file), "--json", "--folds", "5", "-q", "0.8")
    d = json.loads(out)
    assert code == 0 and d["level"] == 0.8 and d["model"] == "ridge"
    assert d["protocol"].startswith("task-grouped") and d["other_protocol"]["group_by"] == "session"
    keys = {"coverage", "over_reservation_mean", "under_reservation_mean", "reserved_over_peak"}
    assert keys <= set(d["reservation"])
    assert 0 <= d["reservation"]["coverage"] <= 1 and d["other_protocol"]["reservation"] is not None
