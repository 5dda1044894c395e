"""A session's cache key, call by call: the usual agent turn extends the key
in place (the same list, the cursors kept), any other turn rebuilds it (a new
list, the cursors dropped), and either way the key holds exactly the call's
prompt and is what ``prompt_key`` computes without touching the session."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from basin.sim.cache import KeyCursor, RadixCache
from basin.sim.sessions import SessionState
from basin.workload.records import Call, Session


@st.composite
def _sessions(draw: st.DrawFn) -> Session:
    """Calls that mostly reuse the whole previous context; some reuse only part
    of it (compaction), some produce no output or add no suffix."""
    prompt = draw(st.integers(1, 5000), label="first prompt")
    calls = [Call(prompt, prompt, draw(st.integers(0, 400)))]
    for _ in range(draw(st.integers(0, 12), label="more calls")):
        prev = calls[-1]
        context = prev.prompt_tokens + prev.output_tokens
        reused = context if draw(st.booleans()) else draw(st.integers(0, context))
        new = draw(st.integers(0 if reused else 1, 3000))
        calls.append(Call(reused + new, new, draw(st.integers(0, 400))))
    shared = draw(st.integers(0, calls[0].prompt_tokens))
    return Session("s", tuple(calls), shared_prefix_tokens=shared, prefix_group="g")


@settings(max_examples=300, deadline=None)
@given(_sessions())
def test_a_key_grows_in_place_on_the_usual_turn_and_is_rebuilt_otherwise(record):
    state = SessionState(7, record, "base", 0.0, 0, None)
    cache = RadixCache(1 << 20)
    for k, call in enumerate(record.calls):
        before = state.key
        before_pieces = list(before)
        expected = state.prompt_key(k)
        assert state.key is before and state.key == before_pieces  # prompt_key leaves the session alone
        route = state.route
        route.take_key(state.key)
        route.keep_cursor(cache, KeyCursor(cache, cache.root, 0, 0))
        key = state.advance_key(k)
        route.take_key(key)  # as the engine does at the call's submission
        assert key is state.key and key == expected
        assert sum(n for _, n in key) == call.prompt_tokens
        assert all(n > 0 for _, n in key)
        prev = record.calls[k - 1] if k else None
        usual = prev is not None and before_pieces and \
            call.prompt_tokens - call.new_tokens == prev.prompt_tokens + prev.output_tokens
        if usual:
            assert key is before and key[:len(before_pieces)] == before_pieces
            assert route.cursor_on(cache) is not None
        else:
            assert key is not before and route.cursor_on(cache) is None
