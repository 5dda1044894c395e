"""A request body as the engine model's call: cache keys by whole messages,
the token approximation, output length, priority conventions and the fields
named when a body is refused."""

from __future__ import annotations

import pytest

from basin.emulate.calls import DEFAULT_MAX_TOKENS, RequestError, parse_chat, queue_priority

SYSTEM = {"role": "system", "content": "You are a coding agent." * 10}


def convo(*turns: str) -> list[dict]:
    roles = ("user", "assistant")
    return [SYSTEM] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def test_a_conversation_that_grows_by_messages_extends_its_key():
    first = parse_chat({"messages": convo("fix the test")})
    second = parse_chat({"messages": convo("fix the test", "done", "run it again")})
    assert second.key[: len(first.key)] == first.key
    assert len(second.key) == len(first.key) + 2
    assert all(n > 0 for _, n in second.key)  # keys hold no empty pieces
    assert second.prompt_tokens == sum(n for _, n in second.key)


def test_an_edited_message_breaks_the_prefix_from_there_on():
    a = parse_chat({"messages": convo("fix the test", "done", "next")})
    b = parse_chat({"messages": convo("fix the test", "DONE", "next")})
    assert a.key[:2] == b.key[:2] and a.key[2] != b.key[2]
    # Same text under another role is another message.
    c = parse_chat({"messages": [SYSTEM, {"role": "assistant", "content": "fix the test"}]})
    assert c.key[1] != a.key[1]


def test_tokens_are_bytes_over_four_with_at_least_one_per_message():
    call = parse_chat({"messages": [{"role": "user", "content": "x" * 400},
                                    {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
                                    {"role": "user", "content": ""},
                                    {"role": "user", "content": [{"type": "text", "text": "y" * 41}]}]})
    assert [n for _, n in call.key] == [100, 3, 1, 11]  # [{"id":"1"}] is 12 bytes


def test_a_message_is_one_piece_whatever_its_form():
    """Plain {role, content} messages take a fast path; equal messages still give equal
    pieces, and a message with any other field (or content parts) is another message."""
    plain = {"role": "user", "content": "héllo wörld"}
    same = dict(reversed(list(plain.items())))  # key order is not part of a message
    named = {**plain, "name": "alice"}
    parts = {"role": "user", "content": [{"type": "text", "text": "héllo wörld"}]}
    key = parse_chat({"messages": [plain, same, named, parts]}).key
    assert key[0] == key[1]
    assert len({key[0][0], key[2][0], key[3][0]}) == 3
    assert [n for _, n in key] == [4, 4, 4, 4]  # 13 UTF-8 bytes each, whatever the form


def test_output_length_comes_from_the_request_or_the_default():
    assert parse_chat({"messages": convo("a")}).output_tokens == DEFAULT_MAX_TOKENS
    assert not parse_chat({"messages": convo("a")}).limited
    assert parse_chat({"messages": convo("a"), "max_tokens": 7}).output_tokens == 7
    both = parse_chat({"messages": convo("a"), "max_tokens": 7, "max_completion_tokens": 9})
    assert both.output_tokens == 9 and both.limited
    assert parse_chat({"messages": convo("a")}, default_max_tokens=3).output_tokens == 3


def test_affinity_from_header_then_session_id_then_first_non_system_message():
    body = {"messages": convo("task one"), "session_id": "s-1"}
    assert parse_chat(body, routing_key="r-9").affinity == "r-9"
    assert parse_chat(body).affinity == "s-1"
    other = parse_chat({"messages": [SYSTEM, {"role": "user", "content": "task two"}]})
    assert parse_chat({"messages": convo("task one")}).affinity != other.affinity


def test_priority_conventions_match_what_the_gateway_sends():
    # The gateway sends SGLang -rank (higher first) and vLLM rank (lower first):
    # the more urgent rank 1 must sort before rank 5 in both.
    assert queue_priority(-1, "sglang") < queue_priority(-5, "sglang")
    assert queue_priority(1, "vllm") < queue_priority(5, "vllm")
    assert parse_chat({"messages": convo("a")}).priority == 0


@pytest.mark.parametrize("body, field", [
    ([1, 2], "(body)"),
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": ["x"]}]}, "messages[0].content[0]"),
    ({"messages": convo("a"), "max_tokens": 0}, "max_tokens"),
    ({"messages": convo("a"), "max_tokens": "9"}, "max_tokens"),
    ({"messages": convo("a"), "max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"messages": convo("a"), "priority": "high"}, "priority"),
    ({"messages": convo("a"), "priority": True}, "priority"),
    ({"messages": convo("a"), "stream": "yes"}, "stream"),
    ({"messages": convo("a"), "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": convo("a"), "n": 2}, "n"),
    ({"messages": convo("a"), "model": 5}, "model"),
])
def test_bad_bodies_name_the_field(body, field):
    with pytest.raises(RequestError) as err:
        parse_chat(body)
    assert err.value.field == field
    assert f"field '{field}'" in str(err.value)
