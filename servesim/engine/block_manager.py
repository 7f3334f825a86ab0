"""The KV block manager: vLLM 0.32's block pool with prefix caching, in runs instead of single blocks.

Mirrors ``vllm/v1/core/block_pool.py`` (``BlockPool``, ``BlockHashToBlockMap``), ``kv_cache_utils.py``
(``FreeKVCacheBlockQueue``), ``single_type_kv_cache_manager.py`` (``FullAttentionManager``:
``find_longest_cache_hit``, ``get_num_blocks_to_allocate``, ``free``) and ``kv_cache_manager.py``
(``get_computed_blocks``, ``allocate_slots``) for one full-attention KV cache group:

* ``num_gpu_blocks`` blocks, block 0 the null block (never allocated, never freed): ``num_gpu_blocks - 1``
  usable blocks;
* every block has a reference count (the requests holding it); free blocks (count 0) wait in the **free
  queue**, and an allocation pops the queue's head, evicting the cached hash of a block it pops (LRU);
* a request's freed blocks are walked in reverse order (its last block first); those without a hash are
  put at the queue's FRONT (vLLM 0.32's LIFO reuse of uncached blocks), those with one at its TAIL, so
  that a request's last cached block is evicted first;
* with prefix caching on, each full block is named by a hash chained over the blocks before it
  (:mod:`servesim.workload.content`), cached as soon as it fills (``cache_blocks`` with
  ``num_computed + num_new`` tokens, capped at the known tokens); a waiting request's hit is its
  longest run of cached blocks from the start, capped at ``num_tokens - 1`` tokens (block-aligned: the
  last token is always recomputed), minus one block with an EAGLE-family drafter (``use_eagle``); the
  hit blocks are touched (reference count + 1; those with count 0 leave the free queue, so they count
  against the free blocks in the admission check, and blocks held by running requests do not); of
  several blocks with one hash the first cached is hit.

**Runs.** Only blocks that another request can hit need an identity. A request's blocks beyond its
*shareable* prefix (content no other request has, :func:`shareable_blocks`) can only be hit by the same
request after a preemption, so they are kept as counts: the free queue is a count of uncached blocks (all
uncached free blocks are interchangeable and always lie in front of every cached one: uncached blocks are
put at the front, cached ones at the tail) followed by a deque of entries, each either one explicit
cached block (:class:`CachedBlock`, with its hash in the hash map) or a :class:`ChainRun`: the cached
blocks ``first .. end - 1`` of one request's own chain, in the queue as the request freed them (block
``end - 1`` first), so eviction shortens the run from its end and the request's surviving cached prefix is
a range. Python work is per request event and per shareable block, never per token.

**Lazy allocation.** The engine keeps its free-block count in a plain int and allocates by decrementing
it (its run mode allocates the blocks of a whole run of decode steps at once). Allocations only pop the
queue's head, so which requests took the blocks does not matter; the manager applies the pops the engine
made since its last call (:meth:`BlockManager.sync`) before anything that depends on the queue's order
(a free, a lookup, a hit). Pops, frees and hits then happen in the engine's step order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


class CachedBlock:
    """One physical block holding a full, hashed block that other requests can hit (an explicit entry).

    Attributes:
        block_hash: the chained hash (uint64 as int) of the tokens up to the block's end.
        ref_count: requests holding the block (vLLM ``KVCacheBlock.ref_cnt``); 0 = in the free queue.
        queue_slot: its live entry in the free queue, or None when held.

    This class and :class:`QueueSlot`, :class:`CacheHit` and :class:`OwnHit` are plain classes with their
    own ``__init__`` rather than dataclasses: one is built per cached block or lookup, and a dataclass's
    generated ``__init__`` runs interpreted even in the compiled engine. Equality is identity, as the
    dataclasses' ``eq=False`` had it.
    """

    __slots__ = ("block_hash", "ref_count", "queue_slot")

    def __init__(self, block_hash: int, ref_count: int = 1, queue_slot: QueueSlot | None = None) -> None:
        self.block_hash = block_hash
        self.ref_count = ref_count
        self.queue_slot = queue_slot


class QueueSlot:
    """The place of a :class:`CachedBlock` in the free queue; ``live`` is False once a hit took it out
    (removal from the middle of the queue is lazy: the head skips dead slots)."""

    __slots__ = ("block", "live")

    def __init__(self, block: CachedBlock, live: bool = True) -> None:
        self.block = block
        self.live = live


@dataclass(eq=False)
class ChainRun:
    """Cached blocks of one request's own chain in the free queue: block indices ``first .. end - 1`` of
    ``request``'s sequence, minus ``taken`` (indices a hit took out), freed last-first, so eviction takes
    ``end - 1`` first.

    Attributes:
        request: the request whose sequence the blocks hold.
        first: lowest block index still in the run.
        end: one past the highest.
        count: blocks still in the queue (``end - first - len(taken)``).
        taken: indices inside ``first .. end - 1`` removed by a hit.
    """

    request: int
    first: int
    end: int
    count: int
    taken: set[int] = field(default_factory=set)

    def has(self, index: int) -> bool:
        """Whether block ``index`` is still in this run."""
        return self.first <= index < self.end and index not in self.taken

    def take(self, index: int) -> None:
        """Remove block ``index`` (a hit)."""
        self.count -= 1
        if index == self.first:
            self.first += 1
            while self.first in self.taken:
                self.taken.remove(self.first)
                self.first += 1
        elif index == self.end - 1:
            self.end -= 1
            while self.end - 1 in self.taken:
                self.taken.remove(self.end - 1)
                self.end -= 1
        else:
            self.taken.add(index)

    def evict(self, num_blocks: int) -> None:
        """Pop ``num_blocks`` (<= count) blocks from the run's queue end (its highest indices)."""
        self.count -= num_blocks
        if not self.taken:
            self.end -= num_blocks
            return
        while num_blocks:
            self.end -= 1
            if self.end in self.taken:
                self.taken.remove(self.end)
            else:
                num_blocks -= 1
        while self.end - 1 in self.taken:
            self.taken.remove(self.end - 1)
            self.end -= 1


@dataclass(eq=False)
class DeadRun:
    """``count`` cached blocks in the free queue that nobody can hit any more (the own chains of finished
    requests, freed one after another): they only take their place in the eviction order."""

    count: int

    def evict(self, num_blocks: int) -> None:
        """Pop ``num_blocks`` (<= count) of them."""
        self.count -= num_blocks


class CacheHit:
    """A waiting request's prefix-cache hit (vLLM ``get_computed_blocks``).

    Attributes:
        num_blocks: blocks hit (the hit is ``num_blocks x block_size`` tokens).
        num_evictable: of those, blocks in the free queue (reference count 0): taking them costs free
            blocks (vLLM ``_get_num_evictable_blocks``).
        shared: the explicit blocks hit, in block order (indices ``0 ..``).
        own: ``(run, first index, last index + 1)`` ranges of the request's own chain hit, as a list of
            :class:`OwnHit`.
    """

    __slots__ = ("num_blocks", "num_evictable", "shared", "own")

    def __init__(self, num_blocks: int = 0, num_evictable: int = 0, shared: list[CachedBlock] | None = None,
                 own: list[OwnHit] | None = None) -> None:
        self.num_blocks = num_blocks
        self.num_evictable = num_evictable
        self.shared = [] if shared is None else shared
        self.own = [] if own is None else own


class OwnHit:
    """Blocks ``first .. end - 1`` of a request's own chain, hit in ``run``."""

    __slots__ = ("run", "first", "end")

    def __init__(self, run: ChainRun, first: int, end: int) -> None:
        self.run = run
        self.first = first
        self.end = end


NO_HIT = CacheHit()


@dataclass
class PrefixCacheStats:
    """Prefix-cache counters as vLLM 0.32 keeps them (``v1/metrics/stats.py``, ``PrefixCacheStats.record``),
    recorded when a waiting request is admitted: ``queries`` = its known tokens, ``hits`` = its hit
    (tokens); requests that were preempted before count in the ``preempted_*`` fields instead (vLLM's
    ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` export ``queries`` / ``hits``)."""

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """One admitted request's lookup (tokens)."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


def shareable_blocks(content, block_size: int) -> np.ndarray:
    """Per request, how many leading full blocks another request could hit (int64 ``(N,)``, blocks).

    A block can be hit by another request only if that request has the same tokens up to the block's end,
    so only blocks before the request's first segment whose content id no other request has (its own
    message or output, unless a later multi-turn prompt resends it) can be shared; the rest is the
    request's own chain (hit only by itself after a preemption). Conservative: a shareable block may still
    never be hit.

    Args:
        content: :class:`~servesim.workload.content.SequenceContent` of N requests.
        block_size: tokens per KV block.
    """
    n = len(content)
    seg_req = content.segment_request
    ids = content.content_ids
    # requests per content id, counting each (request, id) pair once: the segments sorted by (id, request),
    # a pair counted where it differs from the one before (np.unique(axis=0) on the stacked pairs gives the
    # same counts, tests/test_prefix_caching.py, but sorts rows as opaque bytes: 15 times slower, 0.29 s on
    # the Mooncake conversation trace's 300,000 segments)
    order = np.lexsort((seg_req, ids))
    sorted_ids, sorted_req = ids[order], seg_req[order]
    new_pair = np.ones(len(order), dtype=bool)
    new_pair[1:] = (sorted_ids[1:] != sorted_ids[:-1]) | (sorted_req[1:] != sorted_req[:-1])
    pair_ids = sorted_ids[new_pair]
    first_of_id = np.flatnonzero(np.concatenate(([True], pair_ids[1:] != pair_ids[:-1])))
    uniq = pair_ids[first_of_id]
    counts = np.diff(np.append(first_of_id, len(pair_ids)))  # distinct requests per content id
    solo = counts[np.searchsorted(uniq, ids)] == 1
    ends = content.sequence_tokens.copy()
    starts = content.segment_starts
    first_solo = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_solo, seg_req[solo], starts[solo])
    return np.minimum(first_solo, ends) // block_size


class BlockManager:
    """One replica's KV block pool (see the module docstring).

    Args:
        num_gpu_blocks: vLLM's ``num_gpu_blocks`` (block 0 is the null block).
        block_size: tokens per block.
        enable_prefix_caching: vLLM's ``enable_prefix_caching``; off = counts only.
        content: the workload's :class:`~servesim.workload.content.SequenceContent` (None = nobody shares
            content with anybody).
        use_eagle: an EAGLE-family drafter (EAGLE, EAGLE-3, MTP): hits drop their last block.

    Attributes:
        num_free: free blocks (uncached + cached in the queue) as of the last :meth:`sync`.
    """

    # the whole state, as slots: read on every admission and step (see Engine.__slots__; compiled, an
    # extension type)
    __slots__ = (
        "block_size", "content", "enabled", "hash_to_blocks", "hashes", "held_shared", "lagging", "num_free",
        "num_uncached", "own_runs", "queue", "shareable", "use_eagle", "__weakref__",
    )

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_prefix_caching: bool, content=None,
                 use_eagle: bool = False) -> None:
        self.block_size = int(block_size)
        self.enabled = bool(enable_prefix_caching)
        self.use_eagle = bool(use_eagle)
        self.num_free = int(num_gpu_blocks) - 1  # the null block is never free
        self.num_uncached = self.num_free  # uncached free blocks, all in front of the cached ones
        self.queue: deque = deque()  # cached free blocks in eviction order: QueueSlot or ChainRun
        self.hash_to_blocks: dict[int, list[CachedBlock]] = {}
        self.content = content
        self.shareable = (shareable_blocks(content, self.block_size).tolist()
                          if self.enabled and content is not None else None)
        self.hashes: dict[int, list[int]] = {}  # request -> its shareable blocks' hashes
        self.held_shared: dict[int, list[CachedBlock]] = {}  # request -> explicit cached blocks it holds
        self.own_runs: dict[int, list[ChainRun]] = {}  # request -> its runs in the queue, oldest first
        # requests holding shareable blocks not cached yet (their content may be hit once they fill)
        self.lagging: set[int] = set()

    # ------------------------------------------------------------------ the free queue
    def sync(self, num_free: int) -> None:
        """Apply the allocations the engine made since the last call: it now has ``num_free`` free blocks,
        so pop ``self.num_free - num_free`` blocks from the queue's head (evicting cached ones)."""
        pops = self.num_free - num_free
        if pops <= 0:
            return
        self.num_free = num_free
        if pops <= self.num_uncached:
            self.num_uncached -= pops
            return
        pops -= self.num_uncached
        self.num_uncached = 0
        queue = self.queue
        popleft, table = queue.popleft, self.hash_to_blocks  # bound once: a loop over blocks (hot path)
        while pops:
            entry = queue[0]
            if type(entry) is QueueSlot:
                popleft()
                if entry.live:
                    block = entry.block
                    block.queue_slot = None
                    block_hash = block.block_hash
                    copies = table[block_hash]
                    copies.remove(block)
                    if not copies:
                        del table[block_hash]
                    pops -= 1
            else:
                take = min(pops, entry.count)
                if take:
                    entry.evict(take)
                    pops -= take
                if not entry.count:
                    queue.popleft()

    # ------------------------------------------------------------------ lookups and hits
    def _request_hashes(self, request: int) -> list[int]:
        hashes = self.hashes.get(request)
        if hashes is None:
            hashes = self.content.block_hashes(request, self.block_size, self.shareable[request]).tolist()
            self.hashes[request] = hashes
        return hashes

    def lookup(self, request: int, num_tokens: int, num_free: int) -> CacheHit:
        """The longest prefix-cache hit of waiting ``request`` with ``num_tokens`` known tokens (vLLM
        ``get_computed_blocks``: at most ``(num_tokens - 1) // block_size`` blocks, minus one with EAGLE);
        ``num_free``: the engine's free blocks now (see :meth:`sync`). Takes nothing."""
        if not self.enabled:
            return NO_HIT
        shareable = self.shareable[request] if self.shareable is not None else 0
        if not shareable and request not in self.own_runs:
            return NO_HIT  # nothing it could hit: its content is its own and it never freed cached blocks
        if self.num_free > num_free:
            self.sync(num_free)
        cap = (num_tokens - 1) // self.block_size
        hit = CacheHit()
        j = 0
        if shareable and cap:
            hashes = self._request_hashes(request)
            get = self.hash_to_blocks.get
            shared = hit.shared
            append = shared.append  # locals, not attributes, inside the loop over blocks (hot path)
            evictable = 0
            for index in range(min(shareable, cap)):
                copies = get(hashes[index])
                if copies is None:
                    break
                block = copies[0]
                append(block)
                if not block.ref_count:
                    evictable += 1
            hit.num_evictable = evictable
            j = len(shared)
        if j == shareable and j < cap:
            runs = self.own_runs.get(request)
            if runs:
                j = self._own_hits(runs, j, cap, hit)
        hit.num_blocks = j
        if self.use_eagle and j:
            self._drop_last(hit)
        return hit

    def _own_hits(self, runs: list[ChainRun], j: int, cap: int, hit: CacheHit) -> int:
        """Extend ``hit`` from block ``j`` into the request's own chain (oldest copy first); returns the
        block index where the hit stops."""
        live = [run for run in runs if run.count]
        runs[:] = live
        if len(live) == 1 and not live[0].taken and live[0].first == j:
            end = min(live[0].end, cap)
            if end > j:
                hit.own.append(OwnHit(live[0], j, end))
                hit.num_evictable += end - j
            return max(end, j)
        while j < cap:
            for run in live:
                if run.has(j):
                    if hit.own and hit.own[-1].run is run and hit.own[-1].end == j:
                        hit.own[-1].end = j + 1
                    else:
                        hit.own.append(OwnHit(run, j, j + 1))
                    hit.num_evictable += 1
                    break
            else:
                break
            j += 1
        return j

    @staticmethod
    def _drop_last(hit: CacheHit) -> None:
        """EAGLE: the last matched block is recomputed (vLLM ``drop_eagle_block``)."""
        hit.num_blocks -= 1
        if hit.own:
            last = hit.own[-1]
            last.end -= 1
            if last.end == last.first:
                hit.own.pop()
            hit.num_evictable -= 1
        else:
            block = hit.shared.pop()
            if not block.ref_count:
                hit.num_evictable -= 1

    def touch(self, request: int, hit: CacheHit) -> None:
        """``request`` takes the blocks of ``hit`` (vLLM ``BlockPool.touch``): reference counts + 1, those
        in the free queue leave it. Call right after its :meth:`lookup`, with nothing in between."""
        shared = hit.shared
        if shared:
            for block in shared:
                count = block.ref_count
                if not count:
                    block.queue_slot.live = False
                    block.queue_slot = None
                block.ref_count = count + 1
            self.held_shared[request] = list(shared)
        for own in hit.own:
            run = own.run
            if run.first == own.first and not run.taken:
                run.count -= own.end - own.first
                run.first = own.end
            else:
                for index in range(own.first, own.end):
                    run.take(index)
        self.num_free -= hit.num_evictable

    # ------------------------------------------------------------------ caching and freeing
    def cache(self, request: int, num_tokens: int) -> None:
        """``request``'s first ``num_tokens`` tokens are computed or scheduled (vLLM ``cache_blocks`` with
        ``min(num_computed + num_new, num_tokens)``): cache its shareable blocks that are now full. Its own
        chain needs no call (its cached blocks are a count, given to :meth:`free`)."""
        if self.shareable is None:
            return
        limit = min(num_tokens // self.block_size, self.shareable[request])
        held = self.held_shared.get(request)
        have = len(held) if held is not None else 0
        if limit <= have:
            if have < self.shareable[request]:
                self.lagging.add(request)
            return
        hashes = self._request_hashes(request)
        if held is None:
            held = self.held_shared[request] = []
        table = self.hash_to_blocks
        get, keep = table.get, held.append  # bound once: a loop over blocks (hot path)
        for j in range(have, limit):
            block_hash = hashes[j]
            block = CachedBlock(block_hash)
            keep(block)
            copies = get(block_hash)
            if copies is None:
                table[block_hash] = [block]
            else:
                copies.append(block)
        if limit < self.shareable[request]:
            self.lagging.add(request)
        else:
            self.lagging.discard(request)

    def free(self, request: int, num_blocks: int, num_cached_tokens: int, num_free: int,
             finished: bool = False) -> int:
        """Free all ``num_blocks`` blocks ``request`` holds (vLLM ``FullAttentionManager.free``: in reverse
        order; uncached to the queue's front, cached to its tail).

        Args:
            request: the request.
            num_blocks: blocks it holds (hit and allocated; its block table's length).
            num_cached_tokens: tokens of its blocks that were cached (``min(num_computed + num_new,
                num_tokens)`` at its last scheduling): its first ``num_cached_tokens // block_size`` blocks
                have hashes.
            num_free: the engine's free blocks before this free (see :meth:`sync`).
            finished: the request finished (nobody can hit its own chain any more: its cached blocks
                only keep their place in the queue), rather than being preempted.

        Returns:
            Blocks that became free (fewer than ``num_blocks`` when other requests hold shared ones).
        """
        if not self.enabled:
            self.num_free = num_free + num_blocks
            self.num_uncached = self.num_free
            return num_blocks
        if self.num_free > num_free:
            self.sync(num_free)
        if not num_blocks:
            return 0
        cached = num_cached_tokens // self.block_size
        if cached > num_blocks:
            cached = num_blocks
        shareable = self.shareable[request] if self.shareable is not None else 0
        if shareable:
            self.cache(request, cached * self.block_size)
            self.lagging.discard(request)
        freed = num_blocks - cached  # uncached: to the front
        self.num_uncached += freed
        if cached > shareable:
            if finished:
                if request in self.own_runs:
                    del self.own_runs[request]
                last = self.queue[-1] if self.queue else None
                if type(last) is DeadRun:
                    last.count += cached - shareable
                else:
                    self.queue.append(DeadRun(cached - shareable))
            else:
                run = ChainRun(request, shareable, cached, cached - shareable)
                self.queue.append(run)
                self.own_runs.setdefault(request, []).append(run)
            freed += cached - shareable
        held = self.held_shared.pop(request, None) if shareable else None
        if held:
            enqueue = self.queue.append  # bound once: a loop over blocks (hot path)
            for block in reversed(held):
                count = block.ref_count - 1
                block.ref_count = count
                if not count:
                    slot = QueueSlot(block)
                    block.queue_slot = slot
                    enqueue(slot)
                    freed += 1
        self.num_free += freed
        return freed

    def sync_lagging(self, cached_tokens) -> None:
        """Cache the newly full shareable blocks of every running request that still fills some
        (before a lookup): ``cached_tokens(request)`` gives its cached tokens now."""
        for request in list(self.lagging):
            self.cache(request, cached_tokens(request))
