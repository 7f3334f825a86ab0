"""What each request's tokens are, for prefix caching: segments of shared content and their block hashes.

A workload may say, besides how many tokens each request has, *which* tokens they are, as far as a prefix
cache cares: :class:`SequenceContent`, in ``Workload.content``. Request ``i``'s sequence (its prompt
followed by its output, ``prompt_tokens[i] + output_tokens[i]`` tokens) is a list of **segments**; segment
``s`` is the first ``segment_tokens[s]`` tokens of a piece of text named ``content_ids[s]``. Two segments
with the same content id hold the same tokens as far as both reach (one is a prefix of the other); different
ids hold different tokens. So two requests' sequences agree on their first ``L`` tokens exactly when their
segment lists agree up to there, and :meth:`SequenceContent.common_prefix_tokens` computes that ``L``.

Content ids are uint64 ``namespace << 56 | index`` (:func:`content_id`), so the sources never collide:

* ``NAMESPACE_TRACE_BLOCK``: a trace's own block id (Mooncake ``hash_ids``, index = the id as written);
* ``NAMESPACE_SYSTEM_PROMPT``: shared system prompt number ``k`` of the workload;
* ``NAMESPACE_MESSAGE``: text written by the client that nobody else sends (a synthetic prompt, a user
  message of a conversation, the part of a trace prompt its block ids do not cover); index = the request
  (or, for ``multi_turn``, the turn) it first appears in;
* ``NAMESPACE_OUTPUT``: the tokens a request generates (index as for messages); a multi-turn conversation
  resends them in its next turn's prompt.

**Block hashes.** A vLLM-style prefix cache names each *full* KV block (``block_size`` tokens) by a hash
chained over the blocks before it, so a block is shared only when the whole prefix up to its end is
(vLLM ``v1/core/kv_cache_utils.py``, ``hash_block_tokens(hash_function, parent_block_hash,
curr_block_token_ids, extra_keys)``). Here, for block ``k``
(tokens ``[k B, (k+1) B)`` of the sequence) of a request::

    piece     = the part of one segment inside block k: its content id, offset in the content, tokens and
                position in the block
    mix_piece = mix( mix(mix(content id) + offset) + (position << 32 | tokens) )
    content_k = sum of mix_piece over the block's pieces                          (mod 2^64)
    hash_k    = hash_{k-1} + mix(content_k + mix(k + 1)),   hash_{-1} = ROOT_HASH  (mod 2^64)

with ``mix`` the splitmix64 finaliser (shifts 30, 27, 31 and multipliers 0xbf58476d1ce4e5b9,
0x94d049bb133111eb: Vigna's ``splitmix64.c``, after Steele, Lea & Flood, OOPSLA 2014), a bijection of
64-bit integers. ``ROOT_HASH`` is fixed (vLLM's ``NONE_HASH`` is random per process unless
``PYTHONHASHSEED`` is set) so that the same workload always gives the same hashes. ``hash_k`` depends on its parent ``hash_{k-1}`` and on the block's tokens, as
vLLM's does; it is an additive chain (instead of vLLM's SHA-256 over token ids) so that a request's chain is
one cumulative sum over numpy arrays. Equal prefixes give equal hashes exactly; different prefixes collide
with probability about ``n^2 / 2^65`` for ``n`` distinct blocks (below 1e-5 for ten million blocks). The
last ``num_tokens mod block_size`` tokens of a sequence form a partial block, which is never hashed (vLLM
caches only full blocks). Any ``block_size`` works: a segment that starts inside a block splits it into
pieces (Mooncake's 512-token blocks with ``block_size`` dividing 512 never do: each KV block lies inside
one hash block).

An engine asks ``content.block_hashes(i, block_size, num_blocks)``: the uint64 hashes of request ``i``'s
first ``num_blocks`` full blocks (O(blocks + segments) numpy work, no per-token Python objects; about 40
numpy calls per request), or ``content.block_hashes_many(requests, block_size)`` for many requests in one
pass (:class:`BlockHashes`).

The engine's block manager (:mod:`servesim.engine.block_manager`) reads it for prefix caching.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

NAMESPACE_TRACE_BLOCK = 1
NAMESPACE_SYSTEM_PROMPT = 2
NAMESPACE_MESSAGE = 3
NAMESPACE_OUTPUT = 4
NAMESPACE_SHIFT = 56
MAX_CONTENT_INDEX = (1 << NAMESPACE_SHIFT) - 1
"""Largest index a content id can carry (2^56 - 1)."""

ROOT_HASH = np.uint64(0x9E3779B97F4A7C15)
"""``hash_{-1}``, the parent of every request's first block (the 64-bit golden ratio)."""

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S32 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (a bijection of 64-bit integers; wraps mod 2^64).

    Args:
        x: uint64 array of any shape.

    Returns:
        uint64 array, same shape.
    """
    x = np.array(x, dtype=np.uint64)  # a copy, mixed in place
    x ^= x >> _S30
    x *= _M1
    x ^= x >> _S27
    x *= _M2
    x ^= x >> _S31
    return x


def content_id(namespace: int, index: np.ndarray | int) -> np.ndarray:
    """The uint64 content id ``namespace << 56 | index``.

    Args:
        namespace: one of the ``NAMESPACE_*`` constants (1..127).
        index: int array (any shape) or int, each in ``0..2^56 - 1``.

    Returns:
        uint64 array of the shape of ``index``.

    Raises:
        ValueError: an index out of range (a programming error; loaders check their input first).
    """
    idx = np.asarray(index, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() > MAX_CONTENT_INDEX):
        raise ValueError(f"content index out of range 0..2^56-1 (got {idx.min()}..{idx.max()})")
    return idx.astype(np.uint64) | np.uint64(namespace << NAMESPACE_SHIFT)


@dataclass(frozen=True, eq=False)
class SequenceContent:
    """The content of every request's sequence (prompt then output) as segments, in CSR form.

    Request ``i``'s segments are ``segment_offsets[i] : segment_offsets[i + 1]``, in token order; segment
    ``s`` holds the first ``segment_tokens[s]`` tokens of content ``content_ids[s]`` (see the module
    docstring for the meaning of ids and for the block hashes).

    Attributes:
        segment_offsets: int64 ``(N + 1,)``, non-decreasing, ``segment_offsets[0] == 0``.
        content_ids: uint64 ``(S,)``, the content each segment is a prefix of.
        segment_tokens: int64 ``(S,)``, tokens of each segment (>= 1).

    Raises:
        ValueError: inconsistent shapes, offsets or empty segments (a programming error).
    """

    segment_offsets: np.ndarray
    content_ids: np.ndarray
    segment_tokens: np.ndarray

    def __post_init__(self) -> None:
        off = np.asarray(self.segment_offsets, dtype=np.int64)
        ids = np.asarray(self.content_ids, dtype=np.uint64)
        tok = np.asarray(self.segment_tokens, dtype=np.int64)
        object.__setattr__(self, "segment_offsets", off)
        object.__setattr__(self, "content_ids", ids)
        object.__setattr__(self, "segment_tokens", tok)
        if off.ndim != 1 or off.size < 1 or off[0] != 0 or (np.diff(off) < 0).any():
            raise ValueError("segment_offsets must be 1-D, start at 0 and be non-decreasing")
        if ids.shape != (int(off[-1]),) or tok.shape != ids.shape:
            raise ValueError("content_ids and segment_tokens must have shape (segment_offsets[-1],)")
        if tok.size and tok.min() < 1:
            raise ValueError("segment_tokens must be >= 1")

    # ------------------------------------------------------------------------------ construction

    @classmethod
    def from_parts(
        cls, num_requests: int, request: np.ndarray, order: np.ndarray, ids: np.ndarray, tokens: np.ndarray
    ) -> SequenceContent:
        """Assemble segments given in any order.

        Args:
            num_requests: N.
            request: int64 ``(S,)``, the request (0..N-1) each segment belongs to.
            order: int64 ``(S,)``, sort key of the segment within its request (smaller = earlier tokens).
            ids: uint64 ``(S,)`` content ids.
            tokens: int64 ``(S,)`` tokens per segment; segments with 0 tokens are dropped.

        Returns:
            The content, segments sorted by (request, order).
        """
        keep = np.asarray(tokens) > 0
        request, order = np.asarray(request)[keep], np.asarray(order)[keep]
        ids, tokens = np.asarray(ids, dtype=np.uint64)[keep], np.asarray(tokens, dtype=np.int64)[keep]
        perm = np.lexsort((order, request))
        counts = np.bincount(request, minlength=num_requests)
        offsets = np.zeros(num_requests + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(offsets, ids[perm], tokens[perm])

    @classmethod
    def unique(cls, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> SequenceContent:
        """Content shared by no two requests: request ``i`` = message ``i`` then output ``i``.

        Args:
            prompt_tokens, output_tokens: int64 ``(N,)`` (tokens, >= 1).
        """
        n = len(prompt_tokens)
        req = np.arange(n, dtype=np.int64)
        return cls.from_parts(
            n,
            np.r_[req, req],
            np.r_[np.zeros(n, np.int64), np.ones(n, np.int64)],
            np.r_[content_id(NAMESPACE_MESSAGE, req), content_id(NAMESPACE_OUTPUT, req)],
            np.r_[prompt_tokens, output_tokens],
        )

    @classmethod
    def from_trace_blocks(
        cls,
        block_offsets: np.ndarray,
        block_ids: np.ndarray,
        block_tokens: int,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
    ) -> SequenceContent:
        """Content of a trace whose rows name their prompt's fixed-size blocks (Mooncake ``hash_ids``).

        Request ``i``'s ids are ``block_ids[block_offsets[i]:block_offsets[i+1]]``; id ``j`` covers prompt
        tokens ``[j * block_tokens, (j + 1) * block_tokens)``, cut at the prompt's end, so the last id of a
        prompt that is not a multiple of ``block_tokens`` covers only ``prompt - (n - 1) * block_tokens``
        tokens (the first ones of that id's content). Ids beyond the prompt are ignored; prompt tokens
        beyond the ids (none in the shipped Mooncake files) are the request's own message. The output is
        the request's own.

        Args:
            block_offsets: int64 ``(N + 1,)`` CSR offsets into ``block_ids``.
            block_ids: int64 ``(B,)`` the trace's ids, each in ``0..2^56 - 1``.
            block_tokens: tokens per trace block (512 for Mooncake).
            prompt_tokens, output_tokens: int64 ``(N,)`` (tokens, >= 1).
        """
        n = len(prompt_tokens)
        prompt = np.asarray(prompt_tokens, dtype=np.int64)
        counts = np.diff(block_offsets)
        row = np.repeat(np.arange(n, dtype=np.int64), counts)
        pos = np.arange(len(block_ids), dtype=np.int64) - np.repeat(block_offsets[:-1], counts)
        covered = np.minimum(block_tokens, prompt[row] - pos * block_tokens)
        req = np.arange(n, dtype=np.int64)
        rest = prompt - np.minimum(counts * block_tokens, prompt)
        return cls.from_parts(
            n,
            np.r_[row, req, req],
            np.r_[pos, counts, counts + 1],
            np.r_[
                content_id(NAMESPACE_TRACE_BLOCK, block_ids),
                content_id(NAMESPACE_MESSAGE, req),
                content_id(NAMESPACE_OUTPUT, req),
            ],
            np.r_[np.maximum(covered, 0), rest, output_tokens],
        )

    def prepend(self, ids: np.ndarray, tokens: np.ndarray) -> SequenceContent:
        """This content with one segment put before each request's first (a shared system prompt).

        Args:
            ids: uint64 ``(N,)`` content id of each request's new first segment.
            tokens: int64 ``(N,)`` its tokens; 0 = leave that request unchanged.
        """
        n = len(self)
        seg_req = self.segment_request
        req = np.arange(n, dtype=np.int64)
        rank = np.arange(len(self.content_ids), dtype=np.int64) - self.segment_offsets[seg_req]
        return SequenceContent.from_parts(
            n,
            np.r_[req, seg_req],
            np.r_[np.zeros(n, np.int64), rank + 1],
            np.r_[np.asarray(ids, dtype=np.uint64), self.content_ids],
            np.r_[tokens, self.segment_tokens],
        )

    def take(self, requests: np.ndarray) -> SequenceContent:
        """The content of ``requests`` (int array of request indices), in that order."""
        requests = np.asarray(requests, dtype=np.int64)
        starts = self.segment_offsets[requests]
        counts = self.segment_offsets[requests + 1] - starts
        offsets = np.zeros(len(requests) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        idx = np.repeat(starts - offsets[:-1], counts) + np.arange(int(offsets[-1]), dtype=np.int64)
        return SequenceContent(offsets, self.content_ids[idx], self.segment_tokens[idx])

    # ------------------------------------------------------------------------------ queries

    def __len__(self) -> int:
        return int(self.segment_offsets.shape[0] - 1)

    @cached_property
    def segment_request(self) -> np.ndarray:
        """int64 ``(S,)``: the request each segment belongs to."""
        return np.repeat(np.arange(len(self), dtype=np.int64), np.diff(self.segment_offsets))

    @cached_property
    def segment_starts(self) -> np.ndarray:
        """int64 ``(S,)``: token position of each segment's first token in its request's sequence."""
        before = np.r_[0, np.cumsum(self.segment_tokens)]
        return before[:-1] - before[self.segment_offsets[:-1]][self.segment_request]

    @cached_property
    def segment_mix(self) -> np.ndarray:
        """uint64 ``(S,)``: ``mix(content id)`` of each segment (the first step of every piece's hash)."""
        return mix64(self.content_ids)

    @cached_property
    def sequence_tokens(self) -> np.ndarray:
        """int64 ``(N,)``: tokens of each request's sequence (prompt + output)."""
        before = np.r_[0, np.cumsum(self.segment_tokens)]
        return before[self.segment_offsets[1:]] - before[self.segment_offsets[:-1]]

    def common_prefix_tokens(self, first: int, second: int) -> int:
        """Length (tokens) of the longest common prefix of two requests' sequences (exact)."""
        a = slice(self.segment_offsets[first], self.segment_offsets[first + 1])
        b = slice(self.segment_offsets[second], self.segment_offsets[second + 1])
        ids_a, ids_b = self.content_ids[a], self.content_ids[b]
        tok_a, tok_b = self.segment_tokens[a], self.segment_tokens[b]
        total = 0
        for j in range(min(len(ids_a), len(ids_b))):
            if ids_a[j] != ids_b[j]:
                break
            total += int(min(tok_a[j], tok_b[j]))
            if tok_a[j] != tok_b[j]:
                break
        return total

    def block_hashes(self, request: int, block_size: int, num_blocks: int | None = None) -> np.ndarray:
        """Chained hashes of the first ``num_blocks`` full KV blocks of a request's sequence.

        Args:
            request: request index, ``0 <= request < N``.
            block_size: tokens per KV block (>= 1).
            num_blocks: how many blocks; None = every full block of the sequence
                (``sequence_tokens[request] // block_size``).

        Returns:
            uint64 ``(num_blocks,)``: ``hash_0 .. hash_{num_blocks-1}`` (see the module docstring).

        Raises:
            ValueError: ``block_size < 1``, or ``num_blocks`` negative or more than the full blocks.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 (got {block_size})")
        lo, hi = int(self.segment_offsets[request]), int(self.segment_offsets[request + 1])
        full = int(self.segment_tokens[lo:hi].sum()) // block_size
        if num_blocks is None:
            num_blocks = full
        if not 0 <= num_blocks <= full:
            raise ValueError(f"num_blocks must be in 0..{full} for request {request} (got {num_blocks})")
        return chain_hashes(
            self.segment_mix[lo:hi],
            self.segment_starts[lo:hi],
            np.zeros(hi - lo, dtype=np.int64),
            np.array([num_blocks], dtype=np.int64),
            block_size,
        )

    def block_hashes_many(
        self, requests: np.ndarray, block_size: int, num_blocks: np.ndarray | None = None
    ) -> BlockHashes:
        """:meth:`block_hashes` of several requests at once (one pass of numpy work for all of them).

        Args:
            requests: int ``(R,)`` request indices (any order, repeats allowed).
            block_size: tokens per KV block (>= 1).
            num_blocks: int ``(R,)`` blocks per request; None = every full block of each sequence.

        Returns:
            :class:`BlockHashes`: ``.of(j)`` (= ``hashes[offsets[j]:offsets[j + 1]]``) equals
            ``block_hashes(requests[j], block_size, n_j)``. For every request of the Mooncake conversation
            trace at ``block_size`` 16 that is 9.3 million hashes (75 MB), a few seconds on a 2-core machine.

        Raises:
            ValueError: ``block_size < 1`` or a ``num_blocks`` entry outside ``0..`` the request's full blocks.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1 (got {block_size})")
        requests = np.asarray(requests, dtype=np.int64)
        full = self.sequence_tokens[requests] // block_size
        n = full if num_blocks is None else np.asarray(num_blocks, dtype=np.int64)
        if n.shape != full.shape or (n < 0).any() or (n > full).any():
            raise ValueError("num_blocks must have one entry per request, each in 0..its full blocks")
        part = self.take(requests)
        offsets = np.zeros(len(requests) + 1, dtype=np.int64)
        np.cumsum(n, out=offsets[1:])
        hashes = chain_hashes(part.segment_mix, part.segment_starts, part.segment_request, n, block_size)
        return BlockHashes(offsets, hashes)


@dataclass(frozen=True, eq=False)
class BlockHashes:
    """Block hashes of several requests, in CSR form.

    Attributes:
        offsets: int64 ``(R + 1,)``; the ``j``-th request's hashes are ``hashes[offsets[j]:offsets[j + 1]]``.
        hashes: uint64 ``(offsets[-1],)``.
    """

    offsets: np.ndarray
    hashes: np.ndarray

    def of(self, j: int) -> np.ndarray:
        """uint64: the hashes of the ``j``-th request asked for (a view)."""
        return self.hashes[self.offsets[j] : self.offsets[j + 1]]


def chain_hashes(
    segment_mix: np.ndarray,
    starts: np.ndarray,
    segment_owner: np.ndarray,
    num_blocks: np.ndarray,
    block_size: int,
) -> np.ndarray:
    """Block hash chains of several sequences' first full blocks (see the module docstring).

    Args:
        segment_mix: uint64 ``(S,)``, ``mix(content id)`` of each segment, sequences one after another.
        starts: int64 ``(S,)``, token position of each segment in its sequence (from 0, each segment
            starting where the previous one of its sequence ends).
        segment_owner: int64 ``(S,)``, non-decreasing: the sequence (0..R-1) of each segment.
        num_blocks: int64 ``(R,)``, blocks to hash per sequence (covered by its segments).
        block_size: tokens per block.

    Returns:
        uint64 ``(sum(num_blocks),)``: sequence 0's ``hash_0..``, then sequence 1's, and so on.
    """
    total = int(num_blocks.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint64)
    first_block = np.cumsum(num_blocks) - num_blocks  # (R,)
    live = starts < num_blocks[segment_owner] * block_size
    at = starts[live] + first_block[segment_owner[live]] * block_size  # starts on one concatenated token axis
    mixed = segment_mix[live]
    at_next = np.empty_like(at)
    at_next[:-1] = at[1:]
    at_next[-1] = total * block_size
    # The piece that starts each block: in the segment holding the block's first token, cut at the next
    # segment start (position 0 in the block, so its shape word is just its length).
    first_k = -(-at // block_size)
    seg = np.repeat(np.arange(at.shape[0], dtype=np.int64), -(-at_next // block_size) - first_k)
    block_start = np.arange(0, total * block_size, block_size, dtype=np.int64)
    length = np.minimum(at_next[seg] - block_start, block_size)
    piece = mix64(mix64(mixed[seg] + (block_start - at[seg]).astype(np.uint64)) + length.astype(np.uint64))
    # Segments that start inside a block add their own piece (offset 0 in their content) to it.
    inside = np.flatnonzero(at % block_size != 0)
    if inside.size:
        where = at[inside]
        block = where // block_size
        position = where - block * block_size
        length = np.minimum(at_next[inside], (block + 1) * block_size) - where
        shape = (position.astype(np.uint64) << _S32) | length.astype(np.uint64)
        np.add.at(piece, block, mix64(mix64(mixed[inside]) + shape))
    if num_blocks.shape[0] == 1:
        return ROOT_HASH + np.cumsum(mix64(piece + _block_salt(total)), dtype=np.uint64)
    local = np.arange(total, dtype=np.int64) - np.repeat(first_block, num_blocks)
    term = mix64(piece + _block_salt(int(num_blocks.max()))[local])
    run = np.cumsum(term, dtype=np.uint64)
    return ROOT_HASH + run - np.repeat((run - term)[np.minimum(first_block, total - 1)], num_blocks)


_SALT = np.zeros(0, dtype=np.uint64)


def _block_salt(num_blocks: int) -> np.ndarray:
    """``mix(k + 1)`` for ``k = 0 .. num_blocks - 1`` (uint64), from a table that grows by doubling."""
    global _SALT
    if _SALT.shape[0] < num_blocks:
        size = max(num_blocks, 2 * _SALT.shape[0], 1024)
        _SALT = mix64(np.arange(1, size + 1, dtype=np.uint64))
        _SALT.flags.writeable = False
    return _SALT[:num_blocks]
