"""Mooncake FAST'25 request traces: the raw request view and rebuilt sessions.

The traces (``data/mooncake_fast25/``) list requests with an arrival time in
ms, input and output lengths and ``hash_ids``, one id per 512-token prefix
block, but no session id. Two views are offered:

* :func:`load_request_trace`: the requests in trace order, for replaying
  block-level prefix reuse exactly (``basin cache replay``).
* :func:`load_mooncake_workload`: sessions rebuilt from shared prefixes, so
  the trace can drive the session simulator like any other workload.

Chains are rebuilt with a trie of block ids. A request's parent is the most
recent earlier request that reached the deepest node its own ids match, if
that match covers at least two blocks (block 0 alone is a shared system
prompt, not a conversation). A parent's first child continues its session;
a later child (a fork, rare) starts a new session, because a session is a
sequence, not a tree. Its prefix reuse then shows only in ``block_hashes``.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from basin.errors import BasinInputError, where
from basin.paths import DATA_DIR
from basin.workload.io import SESSION_START_KEY
from basin.workload.records import Call, Session, Workload

#: Tokens per Mooncake hash block.
MOONCAKE_BLOCK_TOKENS = 512
#: A parent must share at least this many leading blocks.
MIN_SHARED_BLOCKS = 2
#: Shipped traces by preset name, with a one-line description.
MOONCAKE_TRACES: dict[str, tuple[str, str]] = {
    "mooncake-conversation": (
        "conversation_trace.jsonl.gz",
        "Mooncake FAST'25 production chat, 1 h: multi-turn chains rebuilt from 512-token prefix hashes",
    ),
    "mooncake-synthetic": (
        "synthetic_trace.jsonl.gz",
        "Mooncake FAST'25 synthetic trace from public multi-turn datasets, Poisson arrivals",
    ),
}

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a request-level trace, in the trace's own terms."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    #: One id per 512-token prefix block; equal leading ids mean a shared prefix.
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ParentLink:
    """The earlier request a request continues, and how many blocks they share."""

    parent: int
    shared_blocks: int


def trace_path(path_or_name: str | Path) -> Path:
    """The file behind a shipped trace name, or the path itself."""
    if str(path_or_name) in MOONCAKE_TRACES:
        return DATA_DIR / "mooncake_fast25" / MOONCAKE_TRACES[str(path_or_name)][0]
    return Path(path_or_name)


def load_request_trace(path_or_name: str | Path) -> list[TraceRequest]:
    """Read a Mooncake trace (``.jsonl`` or ``.jsonl.gz``) in trace order.

    Accepts a shipped name (``mooncake-conversation``, ``mooncake-synthetic``)
    or a file path. Arrivals must not go backwards: replay order is trace order.
    """
    path = trace_path(path_or_name)
    if not path.is_file():
        names = ", ".join(MOONCAKE_TRACES)
        raise BasinInputError(f"{path}: no such file (shipped traces: {names})")
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    requests: list[TraceRequest] = []
    try:
        with opener(path, "rb") as fh:
            for line_no, raw in enumerate(fh, 1):
                if raw.strip():
                    requests.append(_request(path, line_no, raw, requests[-1] if requests else None))
    except (OSError, EOFError, zlib.error) as exc:
        raise BasinInputError(f"{path}: not a readable trace file ({exc})") from exc
    if not requests:
        raise BasinInputError(f"{path}: no requests in the file (is it empty?)")
    return requests


def _request(path: Path, line_no: int, raw: bytes, previous: TraceRequest | None) -> TraceRequest:
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BasinInputError(f"{where(path, line=line_no)}: malformed JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise BasinInputError(
            f"{where(path, line=line_no)}: expected a JSON object, got {type(obj).__name__}")
    for name in _FIELDS:
        if name not in obj:
            raise BasinInputError(f"{where(path, line=line_no, field=name)}: missing")
    stamp = obj["timestamp"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) or stamp < 0:
        raise BasinInputError(
            f"{where(path, line=line_no, field='timestamp')}: expected milliseconds >= 0, got {stamp!r}")
    for name in ("input_length", "output_length"):
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BasinInputError(
                f"{where(path, line=line_no, field=name)}: expected a whole number >= 0, got {value!r}")
    hashes = obj["hash_ids"]
    if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
        raise BasinInputError(f"{where(path, line=line_no, field='hash_ids')}: expected a list of integers")
    request = TraceRequest(stamp / 1000.0, obj["input_length"], obj["output_length"], tuple(hashes))
    if previous is not None and request.arrival_s < previous.arrival_s:
        raise BasinInputError(
            f"{where(path, line=line_no, field='timestamp')}: earlier than the previous request; "
            f"the trace must be in arrival order")
    return request


def _prefix_matches(requests: Sequence[TraceRequest]) -> list[tuple[int, int | None]]:
    """For each request, (blocks matched by any earlier request, latest such request).

    A trie node remembers the last request that passed through it, so the
    latest request reaching the deepest matched node is read off in one walk.
    """
    root: dict[int, list] = {}  # block id -> [children, last request index]
    matches: list[tuple[int, int | None]] = []
    for i, req in enumerate(requests):
        children, depth, latest = root, 0, None
        for h in req.block_hashes:
            node = children.get(h)
            if node is None:
                break
            depth, latest, children = depth + 1, node[1], node[0]
        matches.append((depth, latest))
        children = root
        for h in req.block_hashes:
            node = children.get(h)
            if node is None:
                node = children[h] = [{}, i]
            else:
                node[1] = i
            children = node[0]
    return matches


def find_parents(requests: Sequence[TraceRequest]) -> list[ParentLink | None]:
    """Each request's parent (see the module docstring), or None for a new conversation."""
    return [ParentLink(latest, depth) if depth >= MIN_SHARED_BLOCKS and latest is not None else None
            for depth, latest in _prefix_matches(requests)]


def ideal_prefix_hit_fraction(requests: Sequence[TraceRequest]) -> float:
    """Share of input tokens an infinite prefix cache would serve from cache.

    The upper bound any cache replay of the trace can reach: every block seen
    before is still cached.
    """
    total = sum(r.input_tokens for r in requests)
    hit = sum(min(MOONCAKE_BLOCK_TOKENS * depth, r.input_tokens)
              for r, (depth, _) in zip(requests, _prefix_matches(requests)))
    return hit / total if total else 0.0


def rebuild_sessions(requests: Sequence[TraceRequest], name: str, description: str = "",
                     origin: str = "") -> Workload:
    """Chain requests into sessions through their parents.

    Per continuing call: reused = 512 x shared blocks, clipped to the call's
    input and to the parent's input plus output (a last partial block can
    make the raw product overshoot); new = input - reused. The parent's tool
    gap is the child's arrival minus the parent's arrival, so it includes the
    parent's service time in the original run. Sessions whose first block is
    the first block of another session's first call share it through a
    prefix group (``block<id>``). Session ids are ``req<index of the first
    request>``; ``extra["session_start_s"]`` holds each session's first arrival.
    """
    links = find_parents(requests)
    chains: list[list[int]] = []
    chain_of: list[int] = []
    for i, link in enumerate(links):
        if link is not None and chains[chain_of[link.parent]][-1] == link.parent:
            chain_of.append(chain_of[link.parent])
            chains[chain_of[i]].append(i)
        else:
            chain_of.append(len(chains))
            chains.append([i])
    first_blocks = Counter(requests[c[0]].block_hashes[0] for c in chains if requests[c[0]].block_hashes)
    sessions: list[Session] = []
    starts: dict[str, float] = {}
    for chain in chains:
        calls = []
        for k, i in enumerate(chain):
            req = requests[i]
            reused = 0
            if k > 0:
                parent = requests[chain[k - 1]]
                link = links[i]
                assert link is not None  # a chain's later calls all have a parent link
                reused = min(MOONCAKE_BLOCK_TOKENS * link.shared_blocks, req.input_tokens,
                             parent.input_tokens + parent.output_tokens)
            gap = requests[chain[k + 1]].arrival_s - req.arrival_s if k + 1 < len(chain) else 0.0
            calls.append(Call(req.input_tokens, req.input_tokens - reused, req.output_tokens, gap,
                              req.block_hashes))
        head = requests[chain[0]]
        group_block = head.block_hashes[0] if head.block_hashes else None
        grouped = group_block is not None and first_blocks[group_block] > 1
        sid = f"req{chain[0]:05d}"
        sessions.append(Session(
            session_id=sid, calls=tuple(calls),
            shared_prefix_tokens=min(MOONCAKE_BLOCK_TOKENS, head.input_tokens) if grouped else 0,
            prefix_group=f"block{group_block}" if grouped else None, source=name,
        ))
        starts[sid] = head.arrival_s
    return Workload(name=name, sessions=tuple(sessions), block_tokens=MOONCAKE_BLOCK_TOKENS,
                    description=description, origin=origin, extra={SESSION_START_KEY: starts})


def load_mooncake_workload(path_or_name: str | Path) -> Workload:
    """Sessions rebuilt from a shipped Mooncake trace name or a trace file."""
    path = trace_path(path_or_name)
    key = str(path_or_name)
    if key in MOONCAKE_TRACES:
        name, description = key, MOONCAKE_TRACES[key][1]
    else:
        name = path.name.removesuffix(".gz").removesuffix(".jsonl")
        description = f"sessions rebuilt from the prefix hashes of {path.name}"
    return rebuild_sessions(load_request_trace(path), name, description, origin=str(path))
