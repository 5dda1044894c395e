"""Who a call belongs to, and what it may change (issue 14, items 3 and 4):
the session identity rules, the optional binding of a session to its client
credential, calls the engine refuses never inflating a context, and the engine
priority field owned by the gateway."""

from __future__ import annotations

import pytest
from tests.gateway.test_proxy import QueuePolicy, chat, run, stack
from tests.support.fake_upstream import FakeUpstreamConfig

from basin.policy.base import ControlDecision

CHAT = "/v1/chat/completions"


def _bodies(fake) -> list[dict]:
    return [r["body"] for r in fake.requests if r["path"] == CHAT]


# --------------------------------------------------------------------------- identity rules
def test_the_header_wins_and_the_engines_affinity_field_is_the_gateways_session_id() -> None:
    async def go():
        async with stack(engine="vllm") as (fake, server, client):
            async with client.post(server.url + CHAT, json=chat("from-body"),
                                   headers={"X-Session-Id": "from-header"}) as r:
                assert r.status == 200
            assert server.gate.table.get("from-header") is not None and server.gate.table.get("from-body") is None
            assert _bodies(fake)[-1]["session_id"] == "from-header"
    run(go())


def test_the_openai_user_field_does_not_make_one_session_of_many_conversations() -> None:
    async def go():
        async with stack(policy_obj=QueuePolicy(admit_first=10)) as (fake, server, client):
            for text in ("conversation one", "conversation two"):
                async with client.post(server.url + CHAT, json={**chat(None, text=text), "user": "alice"}) as r:
                    assert r.status == 200
            # Each was a one-call session of its own, and ended with its answer.
            assert server.gate.counts["admitted"] == 2 and server.gate.counts["finished"] == 2
            assert all(b["user"] == "alice" for b in _bodies(fake))  # forwarded unchanged
    run(go())


def test_a_body_field_names_the_session_when_the_header_is_absent() -> None:
    async def go():
        async with stack(session_body_fields=("conversation", "session_id")) as (fake, server, client):
            async with client.post(server.url + CHAT, json={**chat("sid"), "conversation": "conv"}) as r:
                assert r.status == 200
            assert server.gate.table.get("conv") is not None
    run(go())


# --------------------------------------------------------------------------- binding
def test_a_bound_session_refuses_a_strangers_calls_and_end_marker() -> None:
    async def go():
        async with stack(session_binding="Authorization") as (fake, server, client):
            owner = {"X-Session-Id": "mine", "Authorization": "Bearer owner-key"}
            async with client.post(server.url + CHAT, json=chat(None, text="w " * 400), headers=owner) as r:
                assert r.status == 200
            sess = server.gate.table.get("mine")
            context = sess.context_tokens
            stranger = {"X-Session-Id": "mine", "Authorization": "Bearer stolen", "X-Session-End": "true"}
            async with client.post(server.url + CHAT, json=chat(None, text="x"), headers=stranger) as r:
                assert r.status == 403
                err = (await r.json())["error"]
                assert err["type"] == "session_owner_mismatch" and "Authorization" in err["message"]
            async with client.post(server.url + CHAT, json=chat(None), headers={"X-Session-Id": "mine"}) as r:
                assert r.status == 401 and (await r.json())["error"]["type"] == "missing_credential"
            assert server.gate.table.get("mine") is sess and not sess.ending and sess.context_tokens == context
            assert len(_bodies(fake)) == 1  # nothing of the stranger's reached the engine
            async with client.post(server.url + CHAT, json=chat(None), headers={**owner, "X-Session-End": "1"}) as r:
                assert r.status == 200
            assert server.gate.table.get("mine") is None
            # Credentials are kept as keyed digests, never as sent.
            assert sess.owner is not None and b"owner-key" not in sess.owner
    run(go())


def test_without_binding_any_client_may_use_a_session_id() -> None:
    async def go():
        async with stack() as (fake, server, client):
            for key in ("a", "b"):
                async with client.post(server.url + CHAT, json=chat("shared"),
                                       headers={"Authorization": f"Bearer {key}"}) as r:
                    assert r.status == 200
    run(go())


# --------------------------------------------------------------------------- refused calls
def test_a_call_the_engine_refuses_leaves_the_context_where_the_engine_last_confirmed_it() -> None:
    async def go():
        async with stack(FakeUpstreamConfig(refuse_body_bytes=50_000), engine="vllm") as (fake, server, client):
            gate = server.gate
            async with client.post(server.url + CHAT, json=chat("r")) as r:
                usage = (await r.json())["usage"]
            confirmed = usage["prompt_tokens"] + usage["completion_tokens"]
            sess = gate.table.get("r")
            assert sess.context_tokens == confirmed
            huge = chat("r", text="w " * 1_000_000)  # 2 MB: an estimate of 500K tokens
            async with client.post(server.url + CHAT, json=huge) as r:
                assert r.status == 400
            assert sess.context_tokens == confirmed
            assert gate.driver.working_set_tokens == confirmed
            # A session whose very first call is refused holds nothing in the engine.
            async with client.post(server.url + CHAT, json=chat("first", text="w " * 1_000_000)) as r:
                assert r.status == 400
            assert gate.table.get("first").context_tokens == 0
            assert gate.driver.working_set_tokens == confirmed
    run(go())


# --------------------------------------------------------------------------- the priority field
@pytest.mark.parametrize("engine, ordered, expected", [
    ("vllm", False, None), ("sglang", False, None), ("llamacpp", False, None), ("openai", False, None),
    ("vllm", True, 7), ("sglang", True, -7),
])
def test_the_gateway_owns_the_priority_field(engine, ordered, expected) -> None:
    class Unordered(QueuePolicy):
        def control(self, signals, parked):
            return ControlDecision(order_by_priority=False, next_tick_s=3600.0)

    async def go():
        policy = QueuePolicy(admit_first=5) if ordered else Unordered(admit_first=5)
        async with stack(FakeUpstreamConfig(engine=engine if engine != "openai" else "none"), policy_obj=policy,
                         engine=engine, metrics_urls=[] if engine == "openai" else None) as (fake, server, client):
            server.gate.tick(server.clock())
            assert server.gate.ordered is ordered
            async with client.post(server.url + CHAT, json=chat("p")) as r:
                assert r.status == 200
            policy.prio[server.gate.table.get("p").uid] = server.gate.origin_s + 7.2
            async with client.post(server.url + CHAT, json={**chat("p"), "priority": -999999}) as r:
                assert r.status == 200
            assert _bodies(fake)[-1].get("priority") == expected
    run(go())
