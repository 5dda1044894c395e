"""The preset registry and ``basin workload ...``: exit codes, outputs, clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basin.errors import BasinInputError
from basin.paths import DATA_DIR
from basin.workload.io import SESSION_START_KEY, read_workload, write_workload
from basin.workload.records import Call, Session, Workload
from cli_helpers import run_basin as _run


def _tiny(tmp_path: Path, name: str = "tiny.jsonl") -> Path:
    w = Workload("tiny", (Session("a", (Call(100, 100, 10, 0.5), Call(120, 10, 3))),
                          Session("b", (Call(80, 80, 4),))), extra={SESSION_START_KEY: {"a": 0.0, "b": 1.0}})
    path = tmp_path / name
    write_workload(w, path)
    return path


# ---------------------------------------------------------------------------
# The registry


def test_presets_cover_every_kind_with_true_session_counts() -> None:
    from basin.workload.presets import list_presets, resolve_workload

    presets = {p.name: p for p in list_presets()}
    assert {name: p.kind for name, p in presets.items()} == {
        "swebench-deepseek": "real", "terminalbench-claude": "real",
        "terminal-bench": "synthetic", "swe-pro": "synthetic",
        "mooncake-conversation": "trace", "mooncake-synthetic": "trace",
    }
    for name in ("swebench-deepseek", "terminalbench-claude", "mooncake-conversation", "mooncake-synthetic"):
        assert presets[name].sessions == len(resolve_workload(name).sessions), name
    assert all(p.description for p in presets.values())


def test_real_and_trace_presets_are_loaded_once() -> None:
    from basin.workload.presets import resolve_workload

    assert resolve_workload("mooncake-synthetic") is resolve_workload("mooncake-synthetic")


def test_sampling_is_seeded_ordered_and_keeps_start_times() -> None:
    from basin.workload.presets import resolve_workload

    full = resolve_workload("mooncake-synthetic")
    a = resolve_workload("mooncake-synthetic", seed=3, n_sessions=50)
    assert a == resolve_workload("mooncake-synthetic", seed=3, n_sessions=50)
    assert a != resolve_workload("mooncake-synthetic", seed=4, n_sessions=50)
    order = {s.session_id: i for i, s in enumerate(full.sessions)}
    positions = [order[s.session_id] for s in a.sessions]
    assert len(set(positions)) == 50 and positions == sorted(positions)
    assert set(a.extra[SESSION_START_KEY]) == {s.session_id for s in a.sessions}
    with pytest.raises(BasinInputError, match="has 2321 sessions"):
        resolve_workload("mooncake-synthetic", n_sessions=5000)


def test_file_paths_resolve_like_presets(tmp_path: Path) -> None:
    from basin.workload.presets import resolve_workload

    path = _tiny(tmp_path, "tiny.parquet")
    assert resolve_workload(str(path)).sessions == read_workload(path).sessions


def test_synthetic_presets_pass_seed_and_size() -> None:
    from basin.workload.presets import resolve_workload

    w = resolve_workload("terminal-bench", seed=2, n_sessions=7)
    assert len(w.sessions) == 7
    assert w == resolve_workload("terminal-bench", seed=2, n_sessions=7)


def test_unknown_spec_lists_names_and_suffixes() -> None:
    from basin.workload.presets import resolve_workload

    with pytest.raises(BasinInputError) as info:
        resolve_workload("swebench")
    for fragment in ("swebench-deepseek", "terminal-bench", "mooncake-conversation", ".parquet"):
        assert fragment in str(info.value)


# ---------------------------------------------------------------------------
# basin workload ...


@pytest.mark.parametrize("command", ["list", "stats", "synth", "import"])
def test_every_command_help_has_an_example(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = _run(capsys, "workload", command, "--help")
    assert code == 0 and "Example" in out and f"basin workload {command}" in out


def test_list_shows_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "workload", "list")
    assert code == 0
    for name in ("swebench-deepseek", "terminalbench-claude", "terminal-bench", "swe-pro",
                 "mooncake-conversation", "mooncake-synthetic"):
        assert name in out


def test_stats_json_has_exactly_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "workload", "stats", "mooncake-synthetic", "--json")
    assert code == 0
    stats = json.loads(out)
    assert list(stats) == [
        "sessions", "calls", "calls_per_session_p50", "calls_per_session_p90", "prompt_tokens_p50",
        "prompt_tokens_p90", "reuse_fraction", "output_tokens_p50", "tool_gap_s_p50", "tool_gap_s_p90",
        "peak_context_p50", "peak_context_p90", "peak_over_first_prompt_p50",
    ]
    assert (stats["sessions"], stats["calls"]) == (2321, 3993)


def test_stats_table_of_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = _run(capsys, "workload", "stats", str(_tiny(tmp_path)))
    assert code == 0
    assert "reuse_fraction" in out and "91.7 %" in out  # 110 of 120 tokens reused


def test_stats_of_a_broken_file_exits_2_with_the_location(capsys: pytest.CaptureFixture[str],
                                                          tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text('{"session_id": "a", "calls": [{"prompt_tokens": 5, "new_tokens": 9, "output_tokens": 1}]}\n')
    code, out, err = _run(capsys, "workload", "stats", str(path))
    assert code == 2 and out == ""
    assert "error:" in err and "broken.jsonl line 1" in err and "field 'new_tokens'" in err
    assert "Traceback" not in err


def test_stats_of_an_unknown_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "workload", "stats", "no-such-workload")
    assert code == 2 and "unknown workload 'no-such-workload'" in err and "swebench-deepseek" in err


def test_synth_writes_a_readable_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "tb.parquet"
    code, out, _ = _run(capsys, "workload", "synth", "--preset", "terminal-bench", "--sessions", "5",
                        "--seed", "1", "--out", str(out_path))
    assert code == 0 and "wrote 5 sessions" in out
    w = read_workload(out_path)
    assert len(w.sessions) == 5 and w.name == "terminal-bench"


def test_synth_rejects_an_unknown_preset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, "workload", "synth", "--preset", "swebench-deepseek",
                        "--out", str(tmp_path / "x.jsonl"))
    assert code == 2 and "terminal-bench" in err


def test_import_mooncake(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "syn.jsonl.gz"
    trace = DATA_DIR / "mooncake_fast25" / "synthetic_trace.jsonl.gz"
    code, out, _ = _run(capsys, "workload", "import", "mooncake", str(trace), "--out", str(out_path))
    assert code == 0 and "wrote 2321 sessions, 3993 calls" in out
    w = read_workload(out_path)
    assert w.block_tokens == 512 and w.sessions[0].calls[0].block_hashes is not None


def test_import_azure_keeps_arrival_times(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "conv.parquet"
    trace = DATA_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    code, out, _ = _run(capsys, "workload", "import", "azure", str(trace), "--out", str(out_path))
    assert code == 0 and "wrote 19366 sessions" in out
    starts = read_workload(out_path).extra[SESSION_START_KEY]
    assert len(starts) == 19366 and max(starts.values()) > 3000


def test_import_agent_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "swe.parquet"
    calls = DATA_DIR / "derived" / "swebench_minisweagent_deepseek_calls.csv.gz"
    code, out, _ = _run(capsys, "workload", "import", "agent-table", str(calls), "--out", str(out_path))
    assert code == 0 and "wrote 192 sessions, 15415 calls" in out
    w = read_workload(out_path)
    assert all(s.task_text for s in w.sessions)  # the tasks file beside the table was picked up


def test_import_servegen_writes_a_rate_csv(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_path = tmp_path / "rate.csv"
    src = DATA_DIR / "servegen_rates" / "servegen_language_aggregate_rate_10min.csv"
    code, out, _ = _run(capsys, "workload", "import", "servegen", str(src), "--column", "m_large_req_per_s",
                        "--out", str(out_path))
    assert code == 0 and "2016" in out
    lines = out_path.read_text().splitlines()
    assert len(lines) == 2017  # header + one line per 10-minute window


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["azure", "{data}/azure_llm_2023/AzureLLMInferenceTrace_code.csv", "--out", "{tmp}/x.csv"],
         ".jsonl, .jsonl.gz, .parquet"),
        (["mooncake", "{data}/mooncake_fast25/synthetic_trace.jsonl.gz", "--column", "x", "--out", "{tmp}/x.jsonl"],
         "--column applies to servegen only"),
        (["servegen", "{data}/servegen_rates/servegen_language_aggregate_rate_10min.csv", "--out",
          "{tmp}/x.jsonl"], "written as .csv"),
        (["azure", "{tmp}/missing.csv", "--out", "{tmp}/x.jsonl"], "no such file"),
        (["mooncake", "{tmp}/bad.jsonl", "--out", "{tmp}/x.jsonl"], "bad.jsonl line 1, field 'hash_ids'"),
    ],
)
def test_import_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str],
                              fragment: str) -> None:
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    filled = [a.format(data=DATA_DIR, tmp=tmp_path) for a in args]
    code, _, err = _run(capsys, "workload", "import", *filled)
    assert code == 2 and fragment in err, err
