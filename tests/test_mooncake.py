"""Mooncake traces: request view, chain rebuilding, and the published figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from basin.errors import BasinInputError
from basin.workload.io import SESSION_START_KEY
from basin.workload.mooncake import (
    MOONCAKE_BLOCK_TOKENS,
    ParentLink,
    TraceRequest,
    find_parents,
    ideal_prefix_hit_fraction,
    load_mooncake_workload,
    load_request_trace,
    rebuild_sessions,
)


def _req(t: float, n_in: int, n_out: int, *hashes: int) -> TraceRequest:
    return TraceRequest(t, n_in, n_out, hashes)


def test_parent_is_latest_request_reaching_the_deepest_match() -> None:
    reqs = [
        _req(0, 1500, 10, 0, 1, 2),        # 0: root
        _req(1, 1500, 10, 0, 1, 9),        # 1: shares 2 blocks with 0
        _req(2, 2000, 10, 0, 1, 2, 3),     # 2: shares 3 with 0 (deeper than with 1)
        _req(3, 1000, 10, 0, 7),           # 3: only block 0 in common: no parent
        _req(4, 1500, 10, 0, 1, 5),        # 4: 2 blocks; 2 is the latest through (0, 1)
    ]
    assert find_parents(reqs) == [None, ParentLink(0, 2), ParentLink(0, 3), None, ParentLink(2, 2)]


def test_rebuilt_sessions_chain_clip_and_fork() -> None:
    reqs = [
        _req(0.0, 1800, 20, 0, 1, 2, 3),   # 0: starts session req00000
        _req(5.0, 1400, 30, 0, 1, 2, 9),   # 1: continues 0; 3 shared blocks = 1536 > its 1400 tokens
        _req(7.0, 2000, 5, 0, 1, 2, 9, 8),  # 2: continues 1; 4 blocks = 2048 > 1400 + 30 of call 1
        _req(8.0, 2500, 5, 0, 1, 2, 3, 4),  # 3: second child of 0: a fork, its own session
        _req(9.0, 2000, 5, 4, 5),          # 4: an unrelated conversation
    ]
    w = rebuild_sessions(reqs, "t")
    assert [s.session_id for s in w.sessions] == ["req00000", "req00003", "req00004"]
    chain = w.sessions[0]
    assert [c.prompt_tokens for c in chain.calls] == [1800, 1400, 2000]
    # reuse is clipped to the call's own prompt, then to the parent's prompt + output
    assert [c.new_tokens for c in chain.calls] == [1800, 0, 2000 - 1430]
    assert [c.tool_gap_s for c in chain.calls] == [5.0, 2.0, 0.0]
    assert chain.calls[1].block_hashes == (0, 1, 2, 9)
    # the fork's reuse of request 0 stays visible only in its block hashes
    fork = w.sessions[1]
    assert fork.calls[0].new_tokens == 2500 and fork.calls[0].block_hashes[:4] == (0, 1, 2, 3)
    assert (fork.prefix_group, fork.shared_prefix_tokens) == ("block0", MOONCAKE_BLOCK_TOKENS)
    assert chain.prefix_group == "block0"
    assert w.sessions[2].prefix_group is None  # no other session starts with block 4
    assert w.extra[SESSION_START_KEY] == {"req00000": 0.0, "req00003": 8.0, "req00004": 9.0}
    assert w.block_tokens == MOONCAKE_BLOCK_TOKENS


def test_ideal_hit_counts_every_block_seen_before() -> None:
    reqs = [_req(0, 1024, 1, 0, 1), _req(1, 1000, 1, 0, 1), _req(2, 512, 1, 3)]
    # second request: two blocks seen, but only 1000 tokens long
    assert ideal_prefix_hit_fraction(reqs) == pytest.approx(1000 / (1024 + 1000 + 512))


@pytest.fixture(scope="module")
def conversation() -> list[TraceRequest]:
    return load_request_trace("mooncake-conversation")


def test_conversation_trace_matches_the_published_figures(conversation: list[TraceRequest]) -> None:
    assert len(conversation) == 12_031
    assert conversation[-1].arrival_s == pytest.approx(59 * 60, abs=60)
    assert sum(link is not None for link in find_parents(conversation)) == 4658
    assert ideal_prefix_hit_fraction(conversation) == pytest.approx(0.37, abs=0.01)
    assert np.percentile([r.input_tokens for r in conversation], 50) == pytest.approx(6900, rel=0.01)


def test_conversation_sessions_match_the_published_chain_lengths() -> None:
    w = load_mooncake_workload("mooncake-conversation")
    lengths = np.array([s.n_calls for s in w.sessions])
    assert w.n_calls == 12_031
    assert (np.percentile(lengths, 50), np.percentile(lengths, 90), lengths.max()) == (1, 3, 43)
    assert len(w.sessions) == 7386  # 7,373 conversation roots + 13 forks
    gaps = [c.tool_gap_s for s in w.sessions for c in s.calls[:-1]]
    assert np.percentile(gaps, 50) == pytest.approx(123, abs=3)  # human think time


def test_synthetic_trace_matches_the_published_figures() -> None:
    reqs = load_request_trace("mooncake-synthetic")
    assert len(reqs) == 3993
    assert ideal_prefix_hit_fraction(reqs) == pytest.approx(0.65, abs=0.01)
    assert np.percentile([r.output_tokens for r in reqs], 50) == 69


def test_trace_file_path_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    path.write_text(
        json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}) + "\n"
        + json.dumps({"timestamp": 2000, "input_length": 1500, "output_length": 4, "hash_ids": [0, 1, 2]}) + "\n")
    assert load_request_trace(path)[1] == TraceRequest(2.0, 1500, 4, (0, 1, 2))
    w = load_mooncake_workload(path)
    assert w.name == "mine" and len(w.sessions) == 1 and w.sessions[0].calls[1].new_tokens == 1500 - 1024


@pytest.mark.parametrize(
    ("lines", "fragments"),
    [
        (["{oops"], ["line 1", "malformed JSON"]),
        ([{"timestamp": 0, "input_length": 5, "output_length": 1}], ["line 1", "field 'hash_ids'", "missing"]),
        ([{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": []}],
         ["line 1", "field 'input_length'", ">= 0"]),
        (['{"timestamp": Infinity, "input_length": 5, "output_length": 1, "hash_ids": []}'],
         ["line 1", "field 'timestamp'"]),
        ([{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}],
         ["line 1", "field 'hash_ids'"]),
        ([{"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [1]},
          {"timestamp": 3, "input_length": 5, "output_length": 1, "hash_ids": [1]}],
         ["line 2", "field 'timestamp'", "arrival order"]),
        ([], ["no requests"]),
    ],
)
def test_bad_trace_is_rejected_with_its_line(tmp_path: Path, lines: list[object], fragments: list[str]) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    with pytest.raises(BasinInputError) as info:
        load_request_trace(path)
    assert str(path) in str(info.value)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_trace_name_lists_the_shipped_ones() -> None:
    with pytest.raises(BasinInputError, match="mooncake-conversation"):
        load_request_trace("mooncake-toolagent")
