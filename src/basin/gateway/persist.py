"""What of the gateway's state is kept across a restart, and how it is read back.

Kept (:func:`capture`, written by the server's store loop off the request
path): every live session (id, uid, arrival, standing, contexts, calls,
whether the engine has counted its prompt, its end marker, the credential
digest it is bound to, and the policy's own record of it: BASIN's priority,
peak prediction and reservation); the parked order; the policy's state
between decisions (BASIN's budget, plateau, cool-down times, admission flag);
the arrivals of the rate window; the counters; the gateway's clock and the
key of the credential digests. Not kept: calls in flight (their connections
die with the process: the clients retry), the hit-rate window and the backlog
(both refill within a minute of traffic), the engine's scrape, and a
session's task text (its prediction is kept; the text is needed again only
to re-predict from a prompt count, which then uses no text).

Capture costs the request path one set insertion per changed session; the
records are built at each write, for the sessions changed since the last one.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from typing import TYPE_CHECKING, Any

from basin.errors import BasinInputError
from basin.gateway.sessions import GatewaySession, SessionState
from basin.gateway.store import Batch, Stored
from basin.policy.base import SessionInfo
from basin.policy.driver import ARRIVAL_RATE_WINDOW_S, Standing, Tracked

if TYPE_CHECKING:
    from basin.gateway.gate import Gate

log = logging.getLogger("basin.gateway")

#: The layout of the records; a store written in another is refused at start.
SCHEMA = 1


class Journal:
    """What changed since the last write: the session table marks sessions (one
    set insertion per change), the gate adds arrivals."""

    def __init__(self, gate: Gate):
        self.gate = gate
        gate.table.changed = set()
        gate.table.removed = set()
        self.arrivals: list[tuple[int, float]] = []
        #: Session ids the store holds (a session that came and went between two writes,
        #: an anonymous call's, never reaches it, and needs no delete).
        self.stored: set[str] = set(gate.table.sessions)
        gate.on_arrival = self._arrived

    def _arrived(self, uid: int, now_s: float) -> None:
        self.arrivals.append((uid, now_s))

    def capture(self, now_s: float, wall_s: float, binding_key: bytes) -> Batch:
        """The batch of changes since the last capture (taken on the event loop; the write
        runs in a thread). A failed write hands it back to :meth:`retry`."""
        gate = self.gate
        table = gate.table
        changed, removed = table.changed or set(), table.removed or set()
        table.changed, table.removed = set(), set()
        upserts = {}
        for uid in changed:
            sess = table.by_uid.get(uid)
            if sess is not None:
                upserts[sess.session_id] = json.dumps(_record(gate, sess))
        deletes = tuple(sid for sid in removed if sid not in table.sessions and sid in self.stored)
        self.stored.difference_update(deletes)
        self.stored.update(upserts)
        arrivals, self.arrivals = tuple(self.arrivals), []
        return Batch(json.dumps(_meta(gate, now_s, wall_s, binding_key)), upserts, deletes, arrivals,
                     now_s - ARRIVAL_RATE_WINDOW_S)

    def retry(self, batch: Batch) -> None:
        """A write failed: its sessions and arrivals go out with the next one."""
        table = self.gate.table
        assert table.changed is not None and table.removed is not None
        for sid in batch.upserts:
            sess = table.sessions.get(sid)
            if sess is not None:
                table.changed.add(sess.uid)
        table.removed.update(batch.deletes)
        self.stored.update(batch.deletes)
        self.arrivals[:0] = batch.arrivals


def _record(gate: Gate, sess: GatewaySession) -> dict[str, Any]:
    tracked = gate.driver.sessions.get(sess.uid)
    return {
        "uid": sess.uid, "id": sess.session_id, "arrival_s": sess.arrival_s,
        "first_prompt_tokens": sess.first_prompt_tokens, "state": gate.session_state(sess).value,
        "last_seen_s": sess.last_seen_s, "context_tokens": sess.context_tokens,
        "confirmed_context_tokens": sess.confirmed_context_tokens, "calls": sess.calls,
        "counted": sess.counted, "ending": sess.ending,
        "owner": sess.owner.hex() if sess.owner is not None else None,
        "tracked": None if tracked is None else [tracked.standing.value, tracked.context_tokens, tracked.paused],
        "policy": gate.policy.persisted_session(sess.uid),
    }


def _meta(gate: Gate, now_s: float, wall_s: float, binding_key: bytes) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "policy": gate.policy.name, "saved_at_s": now_s, "saved_wall_s": wall_s,
        "next_uid": gate.table._next_uid, "counts": gate.counts, "arrived": gate.arrived,
        "parked": list(gate.driver.parked), "ordered": gate.driver.ordered,
        "policy_state": gate.policy.persisted_state(), "binding_key": binding_key.hex(),
    }


def read_meta(stored: Stored, where: str, policy: str) -> dict[str, Any]:
    """The metadata record, checked against this gateway (a store another policy wrote is refused)."""
    try:
        meta = json.loads(stored.meta)
    except ValueError:
        raise BasinInputError(f"{where}: the state record is not JSON; move the store aside to start "
                              "afresh") from None
    if not isinstance(meta, dict) or meta.get("schema") != SCHEMA:
        raise BasinInputError(f"{where}: the state was written in another layout (schema "
                              f"{meta.get('schema') if isinstance(meta, dict) else '?'}, this gateway reads "
                              f"{SCHEMA}); move the store aside to start afresh")
    if meta.get("policy") != policy:
        raise BasinInputError(f"{where}: the state was written by policy '{meta.get('policy')}', this gateway "
                              f"runs '{policy}'; start with that policy, or name another store (field "
                              "'state_store') to start afresh")
    return meta


def resumed_clock_s(meta: dict[str, Any], wall_s: float) -> float:
    """The gateway's clock at start, continuing the stored one by the wall time passed since."""
    return float(meta["saved_at_s"]) + max(wall_s - float(meta["saved_wall_s"]), 0.0)


def restore(gate: Gate, stored: Stored, meta: dict[str, Any], now_s: float) -> int:
    """Put the stored sessions, parked order, arrivals and policy state back into a fresh
    gate; returns how many sessions came back. Calls in flight are gone: none is counted."""
    table, driver, policy = gate.table, gate.driver, gate.policy
    records = sorted((json.loads(v) for v in stored.sessions), key=lambda r: r["last_seen_s"])
    policy_state = meta.get("policy_state")
    kept = [r for r in records if policy_state is not None or r["state"] == SessionState.ADMITTED.value]
    for r in kept:
        sess = GatewaySession(r["uid"], r["id"], r["arrival_s"], r["first_prompt_tokens"], None,
                              last_seen_s=r["last_seen_s"],
                              context_tokens=r["context_tokens"],
                              confirmed_context_tokens=r["confirmed_context_tokens"], calls=r["calls"],
                              counted=r["counted"], ending=r["ending"],
                              owner=bytes.fromhex(r["owner"]) if r["owner"] is not None else None)
        table.put(sess)
        standing, context, paused = r["tracked"] or [r["state"], sess.context_tokens, False]
        driver.sessions[sess.uid] = Tracked(Standing(standing), context, paused)
        if standing == Standing.ADMITTED.value:
            driver.admitted_count += 1
            driver.working_set_tokens += context
    table._next_uid = max(table._next_uid, int(meta["next_uid"]))
    parked_now = {r["uid"] for r in kept if r["tracked"] and r["tracked"][0] == Standing.PARKED.value}
    order = [uid for uid in meta["parked"] if uid in parked_now]
    order += sorted(parked_now - set(order))
    driver.parked = dict.fromkeys(order)
    driver._arrivals = deque(t for t in stored.arrivals if math.isfinite(t) and t <= now_s)
    driver.ordered = bool(meta["ordered"])
    if policy_state is not None:
        policy.restore(policy_state, {r["uid"]: r["policy"] for r in kept if r["policy"] is not None})
    else:  # a policy that keeps nothing takes the admitted sessions as running ones
        policy.attach([SessionInfo(r["uid"], r["id"], "gateway", r["arrival_s"], r["first_prompt_tokens"], None)
                       for r in kept], now_s)
    gate.counts.update({k: int(v) for k, v in meta["counts"].items() if k in gate.counts})
    gate.arrived = int(meta["arrived"])
    if len(kept) < len(records):
        log.warning("policy %s keeps no state across restarts: %d parked session(s) were not restored (their "
                    "next call arrives afresh)", policy.name, len(records) - len(kept))
    return len(kept)
