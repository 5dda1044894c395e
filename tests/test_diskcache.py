"""The disk cache: computed once, reused across processes, never stale or torn."""

from __future__ import annotations

import pickle

import pytest

from basin import diskcache
from basin.workload.records import Call, Session


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("BASIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BASIN_NO_DISK_CACHE", raising=False)
    diskcache._MEMO.clear()
    yield
    diskcache._MEMO.clear()


def _counting(value):
    calls = []

    def compute():
        calls.append(1)
        return value

    return compute, calls


def test_a_result_is_computed_once_and_read_back_by_a_later_process():
    compute, calls = _counting({"a": 1})
    assert diskcache.cached("demo", "k1", compute) == {"a": 1}
    diskcache._MEMO.clear()  # what a new process sees
    assert diskcache.cached("demo", "k1", compute) == {"a": 1}
    assert len(calls) == 1
    assert (diskcache.cache_dir("demo") / "k1.pickle").is_file()


def test_a_torn_entry_is_recomputed(tmp_path):
    compute, calls = _counting([1, 2, 3])
    path = diskcache.cache_dir("demo") / "k2.pickle"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x80\x05not a whole pickle")
    assert diskcache.cached("demo", "k2", compute) == [1, 2, 3]
    assert calls == [1]
    with open(path, "rb") as fh:
        assert pickle.load(fh) == [1, 2, 3]


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("BASIN_NO_DISK_CACHE", "1")
    compute, calls = _counting(7)
    assert diskcache.cached("demo", "k3", compute) == 7
    assert diskcache.cached("demo", "k3", compute) == 7
    assert len(calls) == 2
    assert not diskcache.cache_dir("demo").exists()


def test_an_unwritable_cache_costs_a_warning_not_the_result(tmp_path, monkeypatch):
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    monkeypatch.setenv("BASIN_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="could not keep a demo result"):
        assert diskcache.cached("demo", "k4", lambda: 5) == 5


def test_keys_change_with_any_part_and_with_the_sources(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("x = 1\n")
    before = diskcache.source_digest([a])
    a.write_text("x = 2\n")
    assert diskcache.source_digest([a]) != before
    assert diskcache.make_key("w", 1, 0.5) != diskcache.make_key("w", 1, 0.25)


def test_the_process_memo_is_bounded():
    for i in range(diskcache._MEMO_ENTRIES + 3):
        diskcache.cached("demo", f"m{i}", lambda i=i: i)
    assert len(diskcache._MEMO) == diskcache._MEMO_ENTRIES


def test_cached_records_round_trip_exactly():
    s = Session("s0", (Call(100, 100, 5, 1.5), Call(120, 15, 7, 0.0, block_hashes=(1, 2))), task_text="t")
    back = pickle.loads(pickle.dumps(s))
    assert back == s and back.calls[1].block_hashes == (1, 2) and back.calls[0].reused_tokens == 0


def test_sessions_pickle_their_calls_as_columns_and_keep_every_field_and_type():
    from dataclasses import fields

    from basin.workload import records

    # Every field of a session but its calls travels with it (a new field must join the pickle).
    assert set(records._SESSION_FIELDS) == {f.name for f in fields(Session)} - {"calls"}
    packed = Session("s1", (Call(100, 100, 5, 1.5), Call(120, 15, 2**40, 0.25)), task_text=None, tags=("a", "b"),
                     shared_prefix_tokens=10, prefix_group="g", source="trace")
    int_gap = Session("s2", (Call(100, 100, 5, 2),))  # an int gap is kept as an int, not packed
    for s in (packed, int_gap):
        back = pickle.loads(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL))
        assert back == s
        for mine, theirs in zip(back.calls, s.calls, strict=True):
            assert [type(getattr(mine, n)) for n in records._SET_CALL_FIELD] == \
                [type(getattr(theirs, n)) for n in records._SET_CALL_FIELD]
    assert records._pack_calls(packed.calls) is not None and records._pack_calls(int_gap.calls) is None
    with pytest.raises(Exception, match="frozen|cannot assign"):
        pickle.loads(pickle.dumps(packed)).calls[0].prompt_tokens = 1  # type: ignore[misc]


def test_workloads_pickle_all_their_sessions_calls_as_one_set_of_columns():
    from dataclasses import fields

    from basin.workload import records
    from basin.workload.records import Workload

    assert set(records._WORKLOAD_FIELDS) == {f.name for f in fields(Workload)} - {"sessions"}
    sessions = (
        Session("a", (Call(100, 100, 5, 1.5), Call(120, 15, 2**40, 0.25)), task_text="t", tags=("x",)),
        Session("b", (Call(64, 64, 3, 0.0, block_hashes=(7,)),)),  # kept as objects
        Session("c", (Call(10, 10, 1, 2),)),  # an int gap: kept as objects, as an int
        Session("d", (Call(50, 50, 0, 0.5),), shared_prefix_tokens=20, prefix_group="g", source="trace"),
    )
    w = Workload("mixed", sessions, block_tokens=64, description="d", origin="o", extra={"k": [1, 2]})
    back = pickle.loads(pickle.dumps(w, protocol=pickle.HIGHEST_PROTOCOL))
    assert back == w and back.extra == {"k": [1, 2]} and back.block_tokens == 64
    assert [type(s.calls) for s in back.sessions] == [tuple] * 4
    assert type(back.sessions[2].calls[0].tool_gap_s) is int
    assert back.sessions[1].calls[0].block_hashes == (7,)
    for mine, theirs in zip((c for s in back.sessions for c in s.calls), (c for s in w.sessions for c in s.calls),
                            strict=True):
        assert [type(getattr(mine, n)) for n in records._SET_CALL_FIELD] == \
            [type(getattr(theirs, n)) for n in records._SET_CALL_FIELD]
    with pytest.raises(Exception, match="frozen|cannot assign"):
        back.sessions[0].calls[0].prompt_tokens = 1  # type: ignore[misc]


def test_reading_an_entry_leaves_the_garbage_collector_as_it_was():
    import gc

    diskcache.cached("demo", "gc", lambda: [1, 2])
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            diskcache._MEMO.clear()
            assert diskcache.cached("demo", "gc", lambda: [0]) == [1, 2]  # read back from disk
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()

