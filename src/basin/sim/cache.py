"""The prefix cache of one prefill instance: a page-granular radix tree with
least-recently-used eviction of unlocked leaves, in SGLang's manner, plus an
optional inclusive host tier (HiCache write-through) and an optional limit on
recurrent-state slots (hybrid models).

Token content is never materialised. A prompt is a *key*: a tuple of pieces
``(chunk_id, n_tokens)``, where a chunk is a run of tokens with one identity
(a session's call suffix, a shared system prompt, a trace's 512-token block).
Two keys share a prefix exactly where their leading pieces share chunk ids.
A tree node holds the token range ``[start, start + length)`` of one chunk.
A chunk's tokens are contiguous in every key, so a node's children are of
two kinds: those that begin a chunk (``start == 0``), held by chunk id in
``children``, and at most one that continues the node's own chunk where it
ends (``next``, made when a node is split or a walk stops inside a piece).
A walk looks a child up by its chunk at a piece's start and takes ``next``
inside a piece: no ``(chunk, offset)`` tuple is built and hashed per step.

LRU bookkeeping is lazy: a match stamps only the deepest matched node and the
deepest device-resident one (every eviction candidate on that path is one of
the two), and a node that becomes a candidate inherits its removed child's
stamp. Candidates sit in heaps with stale entries skipped on pop, so a match
costs O(path) and an eviction O(log n).

Invariants (checked by :meth:`RadixCache.check`, pinned by tests):

* CAP-DEVICE: device tokens (cached nodes plus in-flight allocations) never
  exceed ``device_tokens``; CAP-HOST likewise for the host tier.
* LOCKED-KEPT: a node with ``lock_ref > 0`` is never evicted from any tier.
* LOCK-BALANCE: the lock references in the tree sum to exactly two per live
  lock handle (:attr:`RadixCache.lock_handles`; each :meth:`RadixCache.lock`
  references its match's deepest node and deepest device node).
* INCLUSIVE: with a host tier under write-through, a device node that could
  be backed up is backed up (host space permitting).
* TREE: every node's ancestors are in the tree; a device node's ancestors
  are device-resident.
* DEVICE-CHILDREN: a node's count of device-resident children is exact.
* CHILD-KIND: a child that begins its chunk is held by chunk id; any other
  continues its parent's chunk where the parent ends and is its ``next``.

Locking
-------
A lock references only the two ends of its match, ``last_node`` and
``device_node``; everything above them is protected by the shape of the
tree, since eviction takes only leaves of a tier (a device node with no
device child, a host node with no child at all), and every ancestor of a
locked end has it as a descendant. A split keeps the original node object
as the *tail* (the deeper part) and puts a fresh, unlocked head above it, so
a match handle stays valid across splits: its ends still close the same
token ranges, the head is covered by the tail's lock, and :meth:`unlock`
releases exactly what :meth:`lock` took. (Copying the lock count onto the
head would leave a reference that no handle releases: a node that could
never be evicted again.)
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Final

from basin.sim.invariants import InvariantViolation, require

Key = Sequence[tuple[Hashable, int]]

#: The children of every node that has begun no chunk below it (most nodes:
#: a session's chain ends in one, and a split's head has only ``next``). One
#: shared empty dictionary, never written: :meth:`RadixCache.insert` gives a
#: node whose children are empty a dictionary of its own before it adds one
#: (tested by emptiness, not identity, so a copied tree stays safe too).
_NO_CHILDREN: Final[dict[Hashable, _Node]] = {}


class _Node:
    __slots__ = (
        "chunk", "start", "length", "parent", "children", "next", "on_device", "on_host",
        "lock_ref", "last_access", "has_state", "state_lock", "device_child_count",
    )

    def __init__(self, chunk: Hashable, start: int, length: int, parent: _Node | None):
        self.chunk = chunk
        self.start = start
        self.length = length
        self.parent = parent
        #: Children that begin a chunk, by chunk id (:data:`_NO_CHILDREN` for none).
        self.children: dict[Hashable, _Node] = _NO_CHILDREN
        #: The child that continues this node's chunk from its end, if any.
        self.next: _Node | None = None
        self.on_device = True
        self.on_host = False
        self.lock_ref = 0
        self.last_access = 0.0
        self.has_state = False
        self.state_lock = 0
        #: Children on the device tier (kept current, so that a leaf test is
        #: O(1); DEVICE-CHILDREN checks it).
        self.device_child_count = 0

    def all_children(self) -> list[_Node]:
        kids = list(self.children.values())
        if self.next is not None:
            kids.append(self.next)
        return kids


class _Candidate:
    """An eviction heap's entry: a node as of its stamp. It compares as the
    tuple ``(stamp, seq)`` would, by its own method (see
    :class:`basin.sim.events._Event` for why not a tuple)."""

    __slots__ = ("stamp", "seq", "node")

    def __init__(self, stamp: float, seq: int, node: _Node) -> None:
        self.stamp = stamp
        self.seq = seq
        self.node = node

    def __lt__(self, other: _Candidate) -> bool:
        if self.stamp != other.stamp:
            return self.stamp < other.stamp
        return self.seq < other.seq


class MatchResult:
    """How much of a key the cache holds, by tier.

    ``device_tokens`` are usable as they are; ``host_tokens`` follow them and
    must be loaded back before use. Handles are opaque to callers. Read-only
    by convention: a plain class, because a compiled simulator builds one per
    match and a dataclass's generated ``__init__`` stays interpreted.
    """

    __slots__ = ("device_tokens", "host_tokens", "device_node", "last_node", "device_piece", "last_piece")

    def __init__(self, device_tokens: int, host_tokens: int, device_node: _Node, last_node: _Node,
                 device_piece: int = -1, last_piece: int = -1) -> None:
        self.device_tokens = device_tokens
        self.host_tokens = host_tokens
        self.device_node = device_node
        self.last_node = last_node
        #: Index of the key's piece each end lies in (-1: not tracked), so that
        #: the insert after the request's prefill can resume from an end.
        self.device_piece = device_piece
        self.last_piece = last_piece

    @property
    def total_tokens(self) -> int:
        return self.device_tokens + self.host_tokens


class KeyCursor:
    """Where a key's walk through one cache ended: a node in the tree whose
    path is the key's first ``tokens`` tokens, ending inside piece ``piece``.

    Keys hold no empty pieces (a walk stops at one). A session's next prompt
    extends its previous one, so a walk over the next
    key can start at the cursor instead of the root: a call then costs the
    pieces it adds, not all the pieces of the conversation. The caller
    guarantees the extension (a session drops its cursor when its key is
    rebuilt); the cache checks that the node is still in its tree.
    Read-only by convention (a plain class, as :class:`MatchResult`).
    """

    __slots__ = ("cache", "node", "piece", "tokens")

    def __init__(self, cache: RadixCache, node: _Node, piece: int, tokens: int) -> None:
        self.cache = cache
        self.node = node
        self.piece = piece
        self.tokens = tokens


@dataclass(slots=True)
class TierStats:
    """Running counters a run reports per tier."""

    matched_device_tokens: int = 0
    matched_host_tokens: int = 0
    loaded_tokens: int = 0
    queried_tokens: int = 0
    evicted_device_tokens: int = 0
    evicted_host_tokens: int = 0
    inserted_tokens: int = 0


class RadixCache:
    """Radix prefix cache with a device tier and an optional inclusive host tier.

    ``device_tokens``: device pool size (cached blocks and in-flight prefill
    KV share it). ``host_tokens``: host tier size, 0 for GPU-only.
    ``page_tokens``: page size; keys are cut to whole pages before matching
    and inserting. ``state_slots``: recurrent-state slots for hybrid models
    (``None``: unlimited); a cached prefix is only reusable up to the deepest
    node that still holds a state. ``load_threshold_tokens``: host hits
    shorter than this are recomputed rather than loaded.
    """

    def __init__(
        self,
        device_tokens: int,
        host_tokens: int = 0,
        page_tokens: int = 64,
        state_slots: int | None = None,
        load_threshold_tokens: int = 10,
    ):
        if device_tokens <= 0:
            raise ValueError("device_tokens must be positive")
        if page_tokens <= 0:
            raise ValueError("page_tokens must be positive")
        self.device_capacity = int(device_tokens)
        self.host_capacity = int(host_tokens)
        self.page = int(page_tokens)
        self.state_slots = state_slots
        self.load_threshold = load_threshold_tokens
        self.root = _Node(None, 0, 0, None)
        self.root.on_host = True
        self.root.has_state = True
        self.device_used = 0  # tokens in tree nodes on device
        self.host_used = 0
        self.inflight = 0  # tokens allocated to running prefills, not yet in the tree
        self.states_used = 0
        #: Locks taken and not yet released (LOCK-BALANCE).
        self.lock_handles = 0
        self.stats = TierStats()
        self._seq = 0
        self._dev_heap: list[_Candidate] = []
        self._host_heap: list[_Candidate] = []
        self._state_heap: list[_Candidate] = []

    # ------------------------------------------------------------------ info
    @property
    def device_free(self) -> int:
        return self.device_capacity - self.device_used - self.inflight

    # ----------------------------------------------------------------- match
    def match(self, key: Key, now: float, cursor: KeyCursor | None = None,
              key_tokens: int | None = None, counted: bool = True) -> MatchResult:
        """Longest cached prefix of ``key``, by tier.

        Only whole pages are matched (the query is cut to a page multiple);
        where two keys diverge inside a page the match stops at the
        divergence. Stamps the path's eviction candidates with ``now`` and
        splits a node when the match ends inside it, as a radix tree does.
        ``cursor`` (a walk of a key that ``key`` extends) lets the walk start
        part-way; ``key_tokens`` is the key's length when the caller knows it.
        The result is the same either way. ``counted`` False leaves the tier
        statistics alone: a scheduler ranking its queue looks, it serves nothing.
        """
        total = self._key_tokens(key) if key_tokens is None else key_tokens
        limit = total - total % self.page
        node = self.root
        matched = 0
        first = 0
        offset = 0
        device_node, device_matched, device_piece = node, 0, 0
        state_node, state_matched, state_piece = node, 0, 0
        last_piece = 0
        start = self._resume(cursor)
        if start is not None and cursor is not None:  # (a resumed walk has its cursor)
            node, first, matched = start, cursor.piece, cursor.tokens
            offset = node.start + node.length
            last_piece = first
            if node.on_device:
                device_node, device_matched, device_piece = node, matched, first
            else:
                # Its ancestors down to the device frontier are on the host
                # tier only (TREE: a device node's ancestors are on device).
                d, dm = node, matched
                while not d.on_device:
                    dm -= d.length
                    d = d.parent  # type: ignore[assignment]  # the root is on device
                device_node, device_matched, device_piece = d, dm, -1
        for i in range(first, len(key)):
            chunk, n = key[i]
            n = min(n, limit - matched + offset)
            if n <= 0:
                break
            while offset < n:
                child = node.children.get(chunk) if offset == 0 else node.next
                if child is None:
                    break
                if n - offset < child.length:
                    child = self._split(child, n - offset)
                node = child
                last_piece = i
                offset += child.length
                matched += child.length
                if child.on_device:
                    device_node, device_matched, device_piece = child, matched, i
                if child.has_state:
                    state_node, state_matched, state_piece = child, matched, i
            if offset < n:
                break
            offset = 0
        if self.state_slots is not None and state_matched < matched:
            # A hybrid model resumes only from a node that kept its recurrent
            # state; tokens past it are recomputed.
            node, matched, last_piece = state_node, state_matched, state_piece
            if device_matched > matched:
                device_node, device_matched, device_piece = node, matched, last_piece
        if matched % self.page:
            node, matched, last_piece = self._cut_to_page(node, matched, last_piece)
            if device_matched > matched:
                device_node, device_matched, device_piece = node, matched, last_piece
        host_matched = matched - device_matched
        if 0 < host_matched < self.load_threshold:
            node, host_matched, last_piece = device_node, 0, device_piece
        node.last_access = now
        self._push_candidate(node)
        if device_node is not node:
            device_node.last_access = now
            self._push_candidate(device_node)
        if counted:
            st = self.stats
            st.queried_tokens += total
            st.matched_device_tokens += device_matched
            st.matched_host_tokens += host_matched
        return MatchResult(device_matched, host_matched, device_node, node, device_piece, last_piece)

    def _cut_to_page(self, node: _Node, matched: int, last_piece: int) -> tuple[_Node, int, int]:
        """A match that ends inside a page (the keys diverged there) backed up
        to its last whole page, only whole pages being reusable: the node it
        now ends in (split there), its tokens and its last piece."""
        target = matched - matched % self.page
        # Up to the root at most: a divergence inside the first page keeps nothing.
        while node is not self.root and matched - node.length >= target:
            matched -= node.length
            if node.start == 0:
                # The node began its piece: its parent ends the previous
                # one (keys hold no empty pieces).
                last_piece -= 1
            node = node.parent  # type: ignore[assignment]  # the loop stops at the root
        if matched > target:
            node = self._split(node, node.length - (matched - target))
            matched = target
        return node, matched, last_piece

    def _resume(self, cursor: KeyCursor | None) -> _Node | None:
        """The cursor's node when a walk may start there: it belongs to this
        cache and is still in the tree (hybrid models always walk from the
        root, since their match depends on states along the whole path)."""
        if cursor is None or cursor.cache is not self or self.state_slots is not None:
            return None
        node = cursor.node
        return node if node.parent is not None else None

    def peek(self, key: Key, cursor: KeyCursor | None = None, pieces: int = -1) -> int:
        """Cached tokens (any tier) of ``key``'s prefix, without side effects
        (routers compare instances with it); of its first ``pieces`` pieces
        only when that is not negative."""
        node = self.root
        matched = 0
        first = 0
        offset = 0
        start = self._resume(cursor)
        if start is not None and cursor is not None:
            node, first, matched = start, cursor.piece, cursor.tokens
            offset = node.start + node.length
        for i in range(first, len(key) if pieces < 0 else min(pieces, len(key))):
            chunk, n = key[i]
            while offset < n:
                child = node.children.get(chunk) if offset == 0 else node.next
                if child is None:
                    return matched
                step = min(child.length, n - offset)
                matched += step
                if step < child.length:
                    return matched
                offset += step
                node = child
            offset = 0
        return matched

    def _split(self, node: _Node, head_len: int) -> _Node:
        """Split ``node`` so that its first ``head_len`` tokens form a parent.

        ``node`` stays the tail and keeps its locks; the head starts unlocked
        (the tail's locks protect it: see *Locking* above).
        """
        parent = node.parent
        if parent is None:
            raise InvariantViolation("TREE", "split of a node outside the tree")
        head = _Node(node.chunk, node.start, head_len, parent)
        head.on_device = node.on_device
        head.device_child_count = 1 if node.on_device else 0
        head.on_host = node.on_host
        head.last_access = node.last_access
        if node.start == 0:
            parent.children[node.chunk] = head
        else:
            parent.next = head
        node.start += head_len
        node.length -= head_len
        node.parent = head
        head.next = node
        return head

    # ------------------------------------------------------------- locking
    def lock(self, m: MatchResult) -> None:
        """Protect a matched path from eviction while its request runs."""
        m.last_node.lock_ref += 1
        m.device_node.lock_ref += 1
        self.lock_handles += 1

    def unlock(self, m: MatchResult) -> None:
        """Release a lock taken by :meth:`lock` (once per lock)."""
        for node in (m.last_node, m.device_node):
            node.lock_ref -= 1
            if node.lock_ref < 0:
                raise InvariantViolation("LOCK-BALANCE", "unlock of a node that holds no lock")
            self._push_candidate(node)
        self.lock_handles -= 1

    # ------------------------------------------------------------ allocation
    def allocate(self, n_tokens: int) -> bool:
        """Reserve device space for a prefill's new KV; evicts LRU blocks.

        Returns False (allocating nothing) when even full eviction of unlocked
        blocks cannot make room.
        """
        if n_tokens <= 0:
            return True
        if self.device_free < n_tokens:
            self._evict_device(n_tokens - self.device_free)
            if self.device_free < n_tokens:
                return False
        self.inflight += n_tokens
        return True

    def release(self, n_tokens: int) -> None:
        """Give back an in-flight allocation (e.g. the unaligned tail)."""
        self.inflight -= n_tokens
        if self.inflight < 0:
            raise InvariantViolation("INFLIGHT", "released more than was allocated")

    def load_back(self, m: MatchResult) -> int:
        """Bring the host part of a match onto the device, all or nothing.

        Returns the tokens loaded (0 when space could not be found; the caller
        then recomputes them). The caller holds a lock on ``m``.
        """
        need = m.host_tokens
        if need <= 0:
            return 0
        if self.device_free < need:
            self._evict_device(need - self.device_free)
            if self.device_free < need:
                return 0
        node = m.last_node
        chain: list[_Node] = []
        while node is not m.device_node:
            if node.on_device:
                break
            chain.append(node)
            node = node.parent  # type: ignore[assignment]  # stops at the device node
        loaded = 0
        for node in chain:
            node.on_device = True
            parent = node.parent
            assert parent is not None  # TREE: a chain node is below the device frontier
            parent.device_child_count += 1
            loaded += node.length
        self.device_used += loaded
        self.stats.loaded_tokens += loaded
        # The device frontier moved down: the old device node is no longer a leaf.
        return loaded

    # --------------------------------------------------------------- insert
    def insert(self, key: Key, now: float, allocated_tokens: int, match: MatchResult | None = None,
               key_tokens: int | None = None) -> KeyCursor | None:
        """Cache a finished prefill's prompt (page-aligned).

        ``allocated_tokens`` is the in-flight allocation made for it: it turns
        into cached blocks where the key was not cached yet, and the rest
        (duplicates and the unaligned tail) is freed. ``match`` (the locked
        match the prefill ran with) lets the walk start at its deepest
        device-resident end. Returns a cursor at the key's end for the
        session's next walk (None for an empty key).
        """
        total = self._key_tokens(key) if key_tokens is None else key_tokens
        limit = total - total % self.page
        node = self.root
        pos = 0
        first = 0
        offset = 0
        if match is not None:
            # Both ends are locked, so in the tree; a device-resident end's
            # ancestors are device-resident, so the walk above it would
            # change nothing.
            last = match.last_node
            if match.last_piece >= 0 and last.on_device and last is not self.root:
                node, first, pos = last, match.last_piece, match.device_tokens + match.host_tokens
            elif match.device_piece >= 0 and match.device_node is not self.root:
                node, first, pos = match.device_node, match.device_piece, match.device_tokens
            if node is not self.root:
                offset = node.start + node.length
        new_device = 0
        piece = first
        for i in range(first, len(key)):
            if pos >= limit:
                break
            chunk, n = key[i]
            n = min(n, limit - pos + offset)
            while offset < n:
                child = node.children.get(chunk) if offset == 0 else node.next
                take = n - offset
                if child is None:
                    child = _Node(chunk, offset, take, node)
                    if offset == 0:
                        if not node.children:  # perhaps the shared empty one: never written
                            node.children = {}
                        node.children[chunk] = child
                    else:
                        node.next = child
                    node.device_child_count += 1
                    new_device += take
                    self.stats.inserted_tokens += take
                elif take < child.length:
                    child = self._split(child, take)
                if not child.on_device:
                    child.on_device = True
                    node.device_child_count += 1
                    new_device += child.length
                offset += child.length
                pos += child.length
                node = child
                piece = i
            offset = 0
        # Convert the allocation into cached blocks.
        self.inflight -= allocated_tokens
        if self.inflight < 0:
            raise InvariantViolation("INFLIGHT", "insert released more than was allocated")
        self.device_used += new_device
        if self.device_used + self.inflight > self.device_capacity:
            node.lock_ref += 1
            self._evict_device(self.device_used + self.inflight - self.device_capacity)
            node.lock_ref -= 1
        node.last_access = now
        if self.host_capacity:
            self._write_through(node)
        if self.state_slots is not None and not node.has_state:
            self._take_state(node, now)
        self._push_candidate(node)
        return KeyCursor(self, node, piece, pos) if node is not self.root else None

    def _write_through(self, node: _Node) -> None:
        """Back up a newly cached path on the host (HiCache write-through)."""
        path: list[_Node] = []
        while node is not self.root and not node.on_host:
            path.append(node)
            node = node.parent  # type: ignore[assignment]  # the loop stops at the root
        need = sum(n.length for n in path)
        if need == 0:
            return
        free = self.host_capacity - self.host_used
        if free < need:
            self._evict_host(need - free)
            free = self.host_capacity - self.host_used
        # Back up from the root down while space lasts (a child without its
        # parent on the host would be unreachable after device eviction).
        for n in reversed(path):
            if n.length > free:
                break
            n.on_host = True
            self.host_used += n.length
            free -= n.length

    def _take_state(self, node: _Node, now: float) -> None:
        slots = self.state_slots
        if slots is None:
            raise InvariantViolation("STATE-SLOTS", "state taken without a slot limit")
        if self.states_used >= slots:
            self._evict_states(self.states_used - slots + 1)
        if self.states_used < slots:
            node.has_state = True
            self.states_used += 1
            self._seq += 1
            heappush(self._state_heap, _Candidate(now, self._seq, node))

    # ------------------------------------------------------------- eviction
    def _push_candidate(self, node: _Node) -> None:
        if node is self.root or node.lock_ref:
            return
        self._seq += 1
        if node.on_device and not node.device_child_count:
            heappush(self._dev_heap, _Candidate(node.last_access, self._seq, node))
        elif not node.on_device and not node.children and node.next is None:
            heappush(self._host_heap, _Candidate(node.last_access, self._seq, node))

    def _evict_device(self, n_tokens: int) -> int:
        """Evict least-recently-used device leaves until ``n_tokens`` are free.

        A leaf's parent inherits its stamp; when no other candidate is as old,
        the parent is the next one out, and it is evicted straight away
        instead of going through the heap (the order is the heap's own, so a
        session's chain leaves from its leaf end in one pass).
        """
        freed = 0
        heap = self._dev_heap
        root = self.root
        stats = self.stats
        while freed < n_tokens and heap:
            top = heappop(heap)
            stamp, node = top.stamp, top.node
            if (node.parent is None or not node.on_device or node.lock_ref
                    or stamp != node.last_access or node.device_child_count):
                continue
            while True:
                freed += node.length
                self.device_used -= node.length
                stats.evicted_device_tokens += node.length
                node.on_device = False
                parent = node.parent
                parent.device_child_count -= 1
                if not node.on_host:
                    self._remove_subtree(node)
                else:
                    self._push_candidate(node)
                if parent.last_access < stamp:
                    parent.last_access = stamp
                if (freed < n_tokens and parent is not root and not parent.lock_ref
                        and not parent.device_child_count and parent.last_access == stamp
                        and (not heap or heap[0].stamp > stamp)):
                    node = parent  # the heap would hand it over next
                    continue
                self._push_candidate(parent)
                break
        return freed

    def _evict_host(self, n_tokens: int) -> int:
        """Evict least-recently-used host-only leaves (as :meth:`_evict_device`)."""
        freed = 0
        heap = self._host_heap
        root = self.root
        stats = self.stats
        while freed < n_tokens and heap:
            top = heappop(heap)
            stamp, node = top.stamp, top.node
            if (node.parent is None or node.on_device or node.children or node.next is not None
                    or node.lock_ref or stamp != node.last_access):
                continue
            while True:
                freed += node.length
                parent = node.parent
                self._remove_host_leaf(node)
                stats.evicted_host_tokens += node.length
                if parent.last_access < stamp:
                    parent.last_access = stamp
                if (freed < n_tokens and parent is not root and not parent.on_device and not parent.children
                        and parent.next is None and not parent.lock_ref and parent.last_access == stamp
                        and (not heap or heap[0].stamp > stamp)):
                    node = parent
                    continue
                self._push_candidate(parent)
                break
        return freed

    def _evict_states(self, n_slots: int) -> None:
        freed = 0
        heap = self._state_heap
        while freed < n_slots and heap:
            node = heappop(heap).node
            if not node.has_state or node.parent is None or node.lock_ref:
                continue
            node.has_state = False
            self.states_used -= 1
            freed += 1

    def _remove_host_leaf(self, node: _Node) -> None:
        """Drop a host-only node without children (what host eviction takes):
        :meth:`_remove_subtree` without its walk."""
        self._unlink(node)
        self.host_used -= node.length
        node.on_host = False
        if node.has_state:
            node.has_state = False
            self.states_used -= 1
        node.parent = None

    def _remove_subtree(self, node: _Node) -> None:
        """Drop a node (and any host-only descendants) from the tree."""
        parent = node.parent
        if parent is None:
            raise InvariantViolation("TREE", "removal of a node outside the tree")
        self._unlink(node)
        if node.on_device:
            parent.device_child_count -= 1
        stack = [node]
        while stack:
            n = stack.pop()
            if n.on_host:
                self.host_used -= n.length
                n.on_host = False
            if n.on_device:
                self.device_used -= n.length
                n.on_device = False
            if n.has_state:
                n.has_state = False
                self.states_used -= 1
            n.parent = None
            if n.children:
                stack.extend(n.children.values())
                n.children = _NO_CHILDREN
            if n.next is not None:
                stack.append(n.next)
                n.next = None

    @staticmethod
    def _unlink(node: _Node) -> None:
        """Take ``node`` out of its parent's children (CHILD-KIND says where it is held)."""
        parent = node.parent
        assert parent is not None
        if node.start == 0:
            del parent.children[node.chunk]
        else:
            parent.next = None

    @staticmethod
    def _key_tokens(key: Key) -> int:
        return sum(n for _, n in key)

    def __del__(self) -> None:
        """Unlink every node from its parent and children as the cache goes:
        a node and its parent refer to each other, so a tree left linked
        would be freed only by a collection that finds it (a match held
        elsewhere may outlive the cache; its nodes go with it)."""
        stack = [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.all_children())
            node.parent = None
            node.children = _NO_CHILDREN
            node.next = None
        self._dev_heap = []
        self._host_heap = []
        self._state_heap = []

    # -------------------------------------------------------------- checks
    def nodes(self) -> Iterator[_Node]:
        stack = self.root.all_children()
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.all_children())

    def locked_device_tokens(self, m: MatchResult) -> int:
        """Device tokens a lock on ``m`` keeps in the pool however much else
        is evicted: the path above its deepest locked device node (the
        liveness check's floor)."""
        node: _Node | None = m.last_node if m.last_node.on_device else m.device_node
        total = 0
        while node is not None:
            total += node.length
            node = node.parent
        return total

    def check(self, lock_handles: int | None = None) -> None:
        """Verify the invariants named in the module docstring.

        ``lock_handles``: the number of locks the caller knows to be live
        (requests and pins holding a match); checked against the cache's own
        count when given.
        """
        require(not _NO_CHILDREN, "TREE", "a node added a child to the shared empty children dictionary")
        dev = host = states = 0
        refs = self.root.lock_ref
        on_root = sum(1 for c in self.root.all_children() if c.on_device)
        require(self.root.device_child_count == on_root, "DEVICE-CHILDREN",
                f"root: {self.root.device_child_count} device children counted, {on_root} held")
        for n in self.nodes():
            parent = n.parent
            if parent is None:
                raise InvariantViolation("TREE", "node not registered with its parent")
            if n.start == 0:
                if parent.children.get(n.chunk) is not n:
                    raise InvariantViolation("CHILD-KIND", "a chunk's first node not held by its chunk id")
            elif parent.next is not n or n.chunk != parent.chunk or n.start != parent.start + parent.length:
                raise InvariantViolation("CHILD-KIND", "a node inside a chunk does not continue its parent")
            if n.on_device:
                dev += n.length
                if parent is not self.root and not parent.on_device:
                    raise InvariantViolation("TREE", "device node under an evicted parent")
            if n.on_host:
                host += n.length
            if not (n.on_device or n.on_host):
                raise InvariantViolation("TREE", "node in no tier")
            if n.lock_ref < 0:
                raise InvariantViolation("LOCK-BALANCE", f"negative lock count {n.lock_ref}")
            on_device = sum(1 for c in n.all_children() if c.on_device)
            if n.device_child_count != on_device:
                raise InvariantViolation("DEVICE-CHILDREN",
                                         f"{n.device_child_count} device children counted, {on_device} held")
            refs += n.lock_ref
            if n.has_state:
                states += 1
        require(dev == self.device_used, "ACCOUNTING", f"device tokens {dev} != {self.device_used}")
        require(host == self.host_used, "ACCOUNTING", f"host tokens {host} != {self.host_used}")
        require(self.inflight >= 0, "INFLIGHT", f"negative in-flight allocation {self.inflight}")
        require(self.device_used + self.inflight <= self.device_capacity, "CAP-DEVICE",
                f"{self.device_used} cached + {self.inflight} in flight > {self.device_capacity}")
        require(self.host_used <= max(self.host_capacity, 0), "CAP-HOST",
                f"{self.host_used} > {self.host_capacity}")
        if self.state_slots is not None:
            require(states == self.states_used <= self.state_slots, "STATE-SLOTS",
                    f"{states} states, {self.states_used} counted, {self.state_slots} slots")
        require(refs == 2 * self.lock_handles, "LOCK-BALANCE",
                f"{refs} lock references for {self.lock_handles} live locks (two each)")
        if lock_handles is not None:
            require(lock_handles == self.lock_handles, "LOCK-BALANCE",
                    f"{self.lock_handles} locks in the cache, {lock_handles} held by requests and pins")
