"""Shared-prefix workloads: sequence content and block hashes, Mooncake hash_ids, multi-turn, system prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from servesim.input_files import validate
from servesim.errors import ConfigError, TraceError
from servesim.workload import SequenceContent, build_workload, load_trace, zipf_popularity
from servesim.workload.build import WorkloadFile
from servesim.workload.content import (
    NAMESPACE_MESSAGE,
    NAMESPACE_OUTPUT,
    NAMESPACE_SYSTEM_PROMPT,
    NAMESPACE_TRACE_BLOCK,
    content_id,
)

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE_CONV = ROOT / "workloads" / "traces" / "conversation_trace.jsonl"
FIXED = {"type": "fixed", "value": 10}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed))


def cfg(data: dict):
    return validate(WorkloadFile, data, "test.yaml").root


def tokens_of(content: SequenceContent, i: int) -> list[tuple[int, int]]:
    """Independent oracle: request i's sequence as a list of (content id, offset) tokens."""
    lo, hi = content.segment_offsets[i], content.segment_offsets[i + 1]
    return [
        (int(cid), off)
        for cid, n in zip(content.content_ids[lo:hi], content.segment_tokens[lo:hi])
        for off in range(int(n))
    ]


def shared_leading_blocks(first: np.ndarray, second: np.ndarray) -> int:
    n = min(len(first), len(second))
    differ = np.flatnonzero(first[:n] != second[:n])
    return int(differ[0]) if differ.size else n


def content_from_lists(rows: list[list[tuple[int, int]]]) -> SequenceContent:
    """Content from per-request lists of (content id, tokens)."""
    offsets = np.cumsum([0] + [len(r) for r in rows])
    ids = np.array([cid for r in rows for cid, _ in r], dtype=np.uint64)
    toks = np.array([n for r in rows for _, n in r], dtype=np.int64)
    return SequenceContent(offsets, ids, toks)


# ------------------------------------------------------------------------------ block hashes


# Requests built to break hashes that drop a term: a repeated id (needs the offset in the content), the
# same pieces in another order within a block (needs the position), a shared prefix ending mid-block,
# and a prefix of one content that is longer in the other request.
TRICKY = content_from_lists(
    [
        [(7, 32)],  # 0: x0..x31
        [(7, 16), (7, 16)],  # 1: x0..x15 x0..x15 (block 1 differs from request 0's only by offsets)
        [(1, 4), (2, 12), (9, 20)],  # 2: a0..3 b0..11 ...
        [(2, 12), (1, 4), (9, 20)],  # 3: b0..11 a0..3 ... (block 0: same pieces, other positions)
        [(7, 20), (3, 30)],  # 4: shares 20 tokens with request 0 (mid-block at block_size 16)
        [(7, 40), (4, 8)],  # 5: shares 32 with request 0 (request 0's whole sequence)
        [(1, 4), (2, 12), (9, 20)],  # 6: equal to request 2
    ]
)


@pytest.mark.parametrize("block_size", [1, 3, 4, 8, 16, 20])
def test_hashes_are_equal_exactly_where_whole_prefixes_are_equal(block_size):
    c = TRICKY
    blocks = {i: c.block_hashes(i, block_size) for i in range(len(c))}
    for i in range(len(c)):
        ti = tokens_of(c, i)
        assert len(blocks[i]) == len(ti) // block_size
        for j in range(len(c)):
            tj = tokens_of(c, j)
            for k in range(len(blocks[i])):
                for m in range(len(blocks[j])):
                    same = (k == m) and ti[: (k + 1) * block_size] == tj[: (m + 1) * block_size]
                    assert (blocks[i][k] == blocks[j][m]) == same, (i, j, k, m)


segment_lists = st.lists(
    st.lists(st.tuples(st.integers(1, 3), st.integers(1, 20)), min_size=1, max_size=5), min_size=2, max_size=5
)


@settings(max_examples=60, deadline=None)
@given(rows=segment_lists, block_size=st.integers(1, 24))
def test_random_contents_hash_equal_iff_prefix_equal(rows, block_size):
    # A small id alphabet makes shared prefixes, repeated ids and mid-block boundaries common.
    c = content_from_lists(rows)
    many = c.block_hashes_many(np.arange(len(c)), block_size)
    toks = [tokens_of(c, i) for i in range(len(c))]
    for i in range(len(c)):
        assert len(many.of(i)) == len(toks[i]) // block_size
        for j in range(len(c)):
            for k in range(min(len(many.of(i)), len(many.of(j)))):
                end = (k + 1) * block_size
                assert (many.of(i)[k] == many.of(j)[k]) == (toks[i][:end] == toks[j][:end])
            assert shared_leading_blocks(many.of(i), many.of(j)) == min(
                c.common_prefix_tokens(i, j) // block_size, len(many.of(i)), len(many.of(j))
            )


def test_common_prefix_tokens_matches_the_token_oracle():
    c = TRICKY
    for i in range(len(c)):
        for j in range(len(c)):
            ti, tj = tokens_of(c, i), tokens_of(c, j)
            n = 0
            while n < min(len(ti), len(tj)) and ti[n] == tj[n]:
                n += 1
            assert c.common_prefix_tokens(i, j) == n
    assert c.common_prefix_tokens(0, 4) == 20 and c.common_prefix_tokens(0, 5) == 32


def test_hash_chain_depends_on_the_parent():
    # Same second block content, different first blocks: the second hashes differ (chained), and a
    # prefix of the chain is the chain of the prefix.
    c = content_from_lists([[(1, 16), (5, 16)], [(2, 16), (5, 16)], [(1, 16), (5, 16), (6, 3)]])
    a, b, longer = (c.block_hashes(i, 16) for i in range(3))
    assert a[0] != b[0] and a[1] != b[1]
    assert np.array_equal(longer, a)  # the 3 extra tokens form a partial block: never hashed
    assert np.array_equal(c.block_hashes(2, 16, 1), a[:1])
    assert c.block_hashes(2, 16, 0).shape == (0,)


def test_many_equals_one_at_a_time_and_bad_arguments():
    c = TRICKY
    requests = np.array([5, 0, 3, 3, 6])
    for bs in (4, 7, 16):
        many = c.block_hashes_many(requests, bs)
        for j, r in enumerate(requests):
            assert np.array_equal(many.of(j), c.block_hashes(int(r), bs))
        wanted = np.array([1, 0, 2, 1, 2])
        many = c.block_hashes_many(requests, bs, wanted)
        assert np.array_equal(np.diff(many.offsets), wanted)
        for j, r in enumerate(requests):
            assert np.array_equal(many.of(j), c.block_hashes(int(r), bs, int(wanted[j])))
    with pytest.raises(ValueError, match="block_size"):
        c.block_hashes(0, 0)
    with pytest.raises(ValueError, match=r"num_blocks must be in 0\.\.2"):
        c.block_hashes(0, 16, 3)
    with pytest.raises(ValueError, match="num_blocks"):
        c.block_hashes_many(np.array([0]), 16, np.array([3]))


def test_take_and_prepend_keep_segments_in_order():
    c = TRICKY
    sub = c.take(np.array([4, 1]))
    assert tokens_of(sub, 0) == tokens_of(c, 4) and tokens_of(sub, 1) == tokens_of(c, 1)
    sys_ids = content_id(NAMESPACE_SYSTEM_PROMPT, np.zeros(len(c), dtype=np.int64))
    tokens = np.array([5, 0, 5, 0, 0, 0, 0])
    pre = c.prepend(sys_ids, tokens)
    assert tokens_of(pre, 0) == [(int(sys_ids[0]), k) for k in range(5)] + tokens_of(c, 0)
    assert tokens_of(pre, 1) == tokens_of(c, 1)
    assert np.array_equal(pre.sequence_tokens, c.sequence_tokens + tokens)


# ------------------------------------------------------------------------------ Mooncake hash_ids


def write_three_rows(tmp_path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 0, "input_length": 1000, "output_length": 20, "hash_ids": [1, 5]},
        {"timestamp": 3000, "input_length": 1050, "output_length": 30, "hash_ids": [1, 2, 3]},
    ]
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_hash_blocks_on_kv_blocks_worked_by_hand(tmp_path):
    w = load_trace(write_three_rows(tmp_path), prefix_block_ids=True)
    c = w.content
    block = lambda ids: list(content_id(NAMESPACE_TRACE_BLOCK, np.array(ids)))  # noqa: E731
    # 512-token hash blocks, the last cut at the prompt's end (1100 = 512 + 512 + 76), then the output.
    expected = [
        (block([1, 2, 3]) + [content_id(NAMESPACE_OUTPUT, 0)], [512, 512, 76, 10]),
        (block([1, 5]) + [content_id(NAMESPACE_OUTPUT, 1)], [512, 488, 20]),
        (block([1, 2, 3]) + [content_id(NAMESPACE_OUTPUT, 2)], [512, 512, 26, 30]),
    ]
    for i, (ids, toks) in enumerate(expected):
        lo, hi = c.segment_offsets[i], c.segment_offsets[i + 1]
        assert list(c.content_ids[lo:hi]) == ids and list(c.segment_tokens[lo:hi]) == toks
    # Shared tokens: rows 0 and 1 the first hash block only (512); rows 0 and 2 two blocks and the first
    # 26 tokens of id 3 (1050, the whole of row 2's prompt).
    assert c.common_prefix_tokens(0, 1) == 512 and c.common_prefix_tokens(1, 2) == 512
    assert c.common_prefix_tokens(0, 2) == 1050
    h = {bs: [c.block_hashes(i, bs) for i in range(3)] for bs in (16, 64, 512)}
    # Full blocks of prompt + output: 1110 // 16 = 69, 1020 // 16 = 63, 1080 // 16 = 67.
    assert [len(x) for x in h[16]] == [69, 63, 67]
    # KV block k of 16 tokens lies in hash block floor(16 k / 512): rows 0/1 share 512 / 16 = 32 blocks;
    # rows 0/2 share 65 = floor(1050 / 16): 64 blocks of ids 1 and 2, then block 64 (tokens 1024..1039,
    # the first 16 of id 3); block 65 holds id 3's tokens 16..31 in row 0 but 10 of them and 6 output
    # tokens in row 2, so it differs.
    assert shared_leading_blocks(h[16][0], h[16][1]) == 32
    assert shared_leading_blocks(h[16][0], h[16][2]) == 65
    assert shared_leading_blocks(h[16][1], h[16][2]) == 32
    assert shared_leading_blocks(h[64][0], h[64][2]) == 16 and shared_leading_blocks(h[64][0], h[64][1]) == 8
    assert shared_leading_blocks(h[512][0], h[512][2]) == 2 and shared_leading_blocks(h[512][0], h[512][1]) == 1
    # A block size that does not divide 512 works the same way: shared = floor(shared tokens / B).
    h24 = [c.block_hashes(i, 24) for i in range(3)]
    assert shared_leading_blocks(h24[0], h24[2]) == 1050 // 24 and shared_leading_blocks(h24[0], h24[1]) == 512 // 24


def test_mooncake_conversation_trace_content_covers_every_prompt():
    w = load_trace(MOONCAKE_CONV, prefix_block_ids=True, max_requests=400)
    c = w.content
    trace_block = (c.content_ids >> np.uint64(56)) == NAMESPACE_TRACE_BLOCK
    covered = np.bincount(c.segment_request[trace_block], weights=c.segment_tokens[trace_block], minlength=len(w))
    assert np.array_equal(covered, w.prompt_tokens)  # ceil(L / 512) ids cover each prompt exactly
    ids = w.meta.prefix_block_ids
    assert ids[0][0] == ids[1][0] and ids[0][1] != ids[1][1]  # rows 1 and 2 share hash block 0 only
    assert shared_leading_blocks(c.block_hashes(0, 16), c.block_hashes(1, 16)) == 32


def test_hash_ids_change_no_request_of_the_replay():
    kw = {"type": "trace", "path": str(MOONCAKE_CONV), "start_s": 600, "duration_s": 300, "rate_scale": 2}
    plain = build_workload(cfg(kw), rng())
    hashed = build_workload(cfg({**kw, "hash_ids": True}), rng())
    assert plain.content is None and len(hashed.content) == len(plain) > 100
    for a, b in ((plain.arrival_s, hashed.arrival_s), (plain.prompt_tokens, hashed.prompt_tokens),
                 (plain.output_tokens, hashed.output_tokens)):
        assert np.array_equal(a, b)
    assert plain.description == hashed.description


def test_hash_ids_config_and_errors(tmp_path):
    w = build_workload(cfg({"type": "trace", "path": str(write_three_rows(tmp_path)), "hash_ids": True}), rng())
    assert w.content is not None and len(w.content) == 3
    assert build_workload(cfg({"type": "trace", "path": str(MOONCAKE_CONV), "max_requests": 3}), rng()).content is None
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n'
                   '{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["x"]}\n')
    with pytest.raises(TraceError, match=r"bad\.jsonl: line 2: hash_ids: expected integer ids") as info:
        load_trace(bad, prefix_block_ids=True)
    assert "\n" not in str(info.value)
    none = tmp_path / "none.jsonl"
    none.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n')
    with pytest.raises(TraceError, match=r"none\.jsonl: hash_ids: true, but not every row"):
        build_workload(cfg({"type": "trace", "path": str(none), "hash_ids": True}), rng())


# ------------------------------------------------------------------------------ multi-turn


def multi_turn(**over) -> dict:
    base = {
        "type": "multi_turn",
        "rate": 0.5,
        "num_sessions": 40,
        "turns": {"type": "uniform", "low": 1, "high": 6},
        "message_tokens": {"type": "lognormal", "mean": 200, "cv": 1},
        "output_tokens": {"type": "uniform", "low": 10, "high": 300},
        "think_time_s": 20,
    }
    return {**base, **over}


def by_session(w):
    out: dict[int, list[int]] = {}
    for i in np.lexsort((w.sessions.turn_index, w.sessions.session_id)):
        out.setdefault(int(w.sessions.session_id[i]), []).append(int(i))
    return out


def test_multi_turn_prompt_is_history_plus_message_closed_form():
    # Fixed sizes: turn t's prompt = t (message + output) + message = 100 + 150 t; fixed think time:
    # turn t arrives 10 t s after its session's first turn.
    w = build_workload(cfg(multi_turn(
        turns={"type": "fixed", "value": 4}, message_tokens={"type": "fixed", "value": 100},
        output_tokens={"type": "fixed", "value": 50}, think_time_s=10, think_time_cv=0)), rng(3))
    assert len(w) == 160 and (np.diff(w.arrival_s) >= 0).all()
    assert np.array_equal(w.prompt_tokens, 100 + 150 * w.sessions.turn_index)
    for turns in by_session(w).values():
        assert [int(w.sessions.turn_index[i]) for i in turns] == [0, 1, 2, 3]
        assert np.allclose(w.arrival_s[turns] - w.arrival_s[turns[0]], [0, 10, 20, 30], rtol=0, atol=1e-9)


def test_multi_turn_each_prompt_extends_the_previous_sequence():
    w = build_workload(cfg(multi_turn()), rng(5))
    c = w.content
    sessions = by_session(w)
    assert sum(map(len, sessions.values())) == len(w)
    for turns in sessions.values():
        first = turns[0]
        lo, hi = c.segment_offsets[first], c.segment_offsets[first + 1]
        assert list(c.segment_tokens[lo:hi]) == [w.prompt_tokens[first], w.output_tokens[first]]
        for prev, cur in zip(turns, turns[1:]):
            history = int(w.prompt_tokens[prev] + w.output_tokens[prev])
            # The previous turn's whole sequence is a prefix of this prompt, followed by a new message.
            assert c.common_prefix_tokens(prev, cur) == history
            assert tokens_of(c, cur)[:history] == tokens_of(c, prev)
            last_prompt_segment = c.segment_offsets[cur + 1] - 2
            assert c.content_ids[last_prompt_segment] >> np.uint64(56) == NAMESPACE_MESSAGE
            assert w.prompt_tokens[cur] == history + c.segment_tokens[last_prompt_segment]
            assert shared_leading_blocks(c.block_hashes(prev, 16), c.block_hashes(cur, 16)) == history // 16
    # Different sessions share nothing (no system prompts here).
    heads = [t[0] for t in sessions.values()]
    assert all(c.common_prefix_tokens(a, b) == 0 for a in heads[:10] for b in heads[:10] if a != b)


def test_multi_turn_is_reproducible_and_draws_are_independent():
    a = build_workload(cfg(multi_turn()), rng(11))
    b = build_workload(cfg(multi_turn()), rng(11))
    for x, y in ((a.arrival_s, b.arrival_s), (a.prompt_tokens, b.prompt_tokens), (a.output_tokens, b.output_tokens),
                 (a.content.content_ids, b.content.content_ids), (a.content.segment_tokens, b.content.segment_tokens),
                 (a.sessions.session_id, b.sessions.session_id)):
        assert np.array_equal(x, y)
    other = build_workload(cfg(multi_turn()), rng(12))
    assert not np.array_equal(a.arrival_s[:5], other.arrival_s[:5])
    timed = build_workload(cfg(multi_turn(num_sessions=None, duration_s=60)), rng(11))
    starts = timed.arrival_s[timed.sessions.turn_index == 0]
    assert len(starts) == len(set(timed.sessions.session_id)) and (starts < 60).all()
    # Changing the output distribution leaves session starts, turns and think times unchanged.
    c = build_workload(cfg(multi_turn(output_tokens={"type": "fixed", "value": 7})), rng(11))
    assert np.array_equal(a.arrival_s, c.arrival_s) and np.array_equal(a.sessions.turn_index, c.sessions.turn_index)


def test_multi_turn_session_rate_and_think_time_statistics():
    w = build_workload(cfg(multi_turn(num_sessions=20000, think_time_s=30, think_time_cv=1,
                                      turns={"type": "fixed", "value": 2})), rng(2))
    sessions = by_session(w)
    starts = np.sort([w.arrival_s[t[0]] for t in sessions.values()])
    gaps = np.diff(np.r_[0.0, starts])
    think = np.array([w.arrival_s[t[1]] - w.arrival_s[t[0]] for t in sessions.values()])
    # Exponential means (sd = mean): 99.9% intervals of +-3.3 / sqrt(20000) = +-2.3%, so a 5% error in
    # the session rate or the think time falls outside.
    for sample, mean in ((gaps, 2.0), (think, 30.0)):
        assert abs(sample.mean() / mean - 1) < 3.3 / np.sqrt(len(sample))


# ------------------------------------------------------------------------------ system prompts


def test_zipf_popularity_closed_form():
    assert np.allclose(zipf_popularity(3, 1.0), [6 / 11, 3 / 11, 2 / 11], rtol=1e-15)
    assert np.allclose(zipf_popularity(4, 0.0), 0.25, rtol=1e-15)


def poisson_with_system_prompts(n: int, **sp) -> dict:
    return {
        "type": "poisson", "rate": 10, "num_requests": n,
        "prompt_tokens": {"type": "uniform", "low": 5, "high": 50}, "output_tokens": FIXED,
        "system_prompts": {"num_prompts": 10, "prompt_tokens": {"type": "uniform", "low": 100, "high": 900}, **sp},
    }


def system_choice(w) -> np.ndarray:
    """Each request's system prompt rank (0-based), -1 for none, read back from its content."""
    first = w.content.content_ids[w.content.segment_offsets[:-1]]
    is_sys = (first >> np.uint64(56)) == NAMESPACE_SYSTEM_PROMPT
    return np.where(is_sys, (first & np.uint64((1 << 56) - 1)).astype(np.int64), -1)


def test_system_prompt_popularity_chi_square():
    n = 100_000
    w = build_workload(cfg(poisson_with_system_prompts(n, zipf_exponent=1.0)), rng(21))
    counts = np.bincount(system_choice(w), minlength=10)
    assert counts.sum() == n
    p = zipf_popularity(10, 1.0)
    assert stats.chisquare(counts, n * p).pvalue > 0.01
    # A 5% skew is rejected: exponent 1.05, or the top prompt 5% more popular.
    assert stats.chisquare(counts, n * zipf_popularity(10, 1.05)).pvalue < 1e-6
    skewed = p.copy()
    skewed[0] *= 1.05
    assert stats.chisquare(counts, n * skewed / skewed.sum()).pvalue < 1e-6


def test_system_prompt_probability_and_prefix_sharing():
    n = 40_000
    w = build_workload(cfg(poisson_with_system_prompts(n, probability=0.6)), rng(8))
    choice = system_choice(w)
    share = (choice >= 0).mean()
    assert abs(share - 0.6) < 3.3 * np.sqrt(0.24 / n)  # 99.9%: +-0.008; a 5% error (0.63) is far outside
    plain = build_workload(cfg({k: v for k, v in poisson_with_system_prompts(n).items() if k != "system_prompts"}), rng(8))
    # The other draws are unchanged; each prompt grew by its system prompt's length.
    assert np.array_equal(w.arrival_s, plain.arrival_s) and np.array_equal(w.output_tokens, plain.output_tokens)
    extra = w.prompt_tokens - plain.prompt_tokens
    assert (extra[choice < 0] == 0).all() and (extra[choice >= 0] >= 100).all()
    lengths = {int(k): int(extra[choice == k][0]) for k in range(10)}
    assert all((extra[choice == k] == L).all() for k, L in lengths.items())
    c = w.content
    i, j, k = (int(np.flatnonzero(choice == 0)[m]) for m in (0, 1, 2))
    other = int(np.flatnonzero(choice == 1)[0])
    assert c.common_prefix_tokens(i, j) == lengths[0]
    assert shared_leading_blocks(c.block_hashes(i, 16), c.block_hashes(k, 16)) == lengths[0] // 16
    assert shared_leading_blocks(c.block_hashes(i, 16), c.block_hashes(other, 16)) == 0


def test_system_prompts_before_mooncake_hash_blocks(tmp_path):
    data = {"type": "trace", "path": str(write_three_rows(tmp_path)), "hash_ids": True,
            "system_prompts": {"num_prompts": 1, "prompt_tokens": {"type": "fixed", "value": 40}}}
    w = build_workload(cfg(data), rng())
    assert list(w.prompt_tokens) == [1140, 1040, 1090]
    c = w.content
    assert c.common_prefix_tokens(0, 2) == 1090 and c.common_prefix_tokens(0, 1) == 552
    assert shared_leading_blocks(c.block_hashes(0, 16), c.block_hashes(1, 16)) == 552 // 16


def test_system_prompts_of_given_lengths_most_popular_first():
    data = poisson_with_system_prompts(20_000)
    data["system_prompts"] = {"prompt_lengths": [700, 300, 50], "zipf_exponent": 2.0}
    w = build_workload(cfg(data), rng(9))
    plain = build_workload(cfg({k: v for k, v in data.items() if k != "system_prompts"}), rng(9))
    choice = system_choice(w)
    assert np.array_equal(w.prompt_tokens - plain.prompt_tokens, np.array([700, 300, 50])[choice])
    counts = np.bincount(choice, minlength=3)
    assert stats.chisquare(counts, 20_000 * zipf_popularity(3, 2.0)).pvalue > 0.01


def test_multi_turn_system_prompt_is_per_session():
    w = build_workload(cfg(multi_turn(system_prompts={"num_prompts": 3, "prompt_tokens": {"type": "fixed", "value": 64}})), rng(4))
    choice = system_choice(w)
    for turns in by_session(w).values():
        assert len(set(choice[turns])) == 1
    assert (choice >= 0).all() and len(set(choice)) == 3


MT = r"test\.yaml: (multi_turn\.)?"  # the union tag is part of the field's path in some versions
PS = r"test\.yaml: (poisson\.)?system_prompts\."


@pytest.mark.parametrize(
    "data, message",
    [
        (multi_turn(think_time_s=None), MT + "think_time_s: "),
        ({k: v for k, v in multi_turn().items() if k != "think_time_s"}, MT + "think_time_s: required key"),
        (multi_turn(duration_s=60), "exactly one of num_sessions and duration_s"),
        (multi_turn(rate=0), MT + "rate: "),
        (multi_turn(think_time_cv=-1), MT + "think_time_cv: "),
        (multi_turn(turns={"type": "fixed", "value": 0}), MT + r"turns\.(fixed\.)?value: "),
        (multi_turn(sessions=3), MT + "sessions: unknown key"),
        (poisson_with_system_prompts(5, zipf_exponent=-1), PS + "zipf_exponent: "),
        (poisson_with_system_prompts(5, probability=1.5), PS + "probability: "),
        (poisson_with_system_prompts(5, num_prompts=0), PS + "num_prompts: "),
        (poisson_with_system_prompts(5, popularity="zipf"), PS + "popularity: unknown key"),
        ({"type": "trace", "path": "x.csv", "hash_ids": True}, "hash_ids: only Mooncake traces"),
        # a bucket policy on an Azure trace was accepted and did nothing
        ({"type": "trace", "path": "x.csv", "bucket_policy": "burst"}, "bucket_policy: only Mooncake traces"),
        (poisson_with_system_prompts(5, prompt_lengths=[5, 6]), "exactly one of prompt_tokens"),
        ({**poisson_with_system_prompts(5), "system_prompts": {"prompt_tokens": FIXED}}, "num_prompts is required"),
        ({**poisson_with_system_prompts(5), "system_prompts": {"num_prompts": 3, "prompt_lengths": [5, 6]}},
         r"num_prompts \(3\) must equal the number of prompt_lengths \(2\)"),
        ({**poisson_with_system_prompts(5), "system_prompts": {"prompt_lengths": [5, 0]}},
         PS + r"prompt_lengths\.1: "),
    ],
)
def test_config_errors_are_one_line_naming_the_field(data, message):
    with pytest.raises(ConfigError, match=message) as info:
        cfg(data)
    assert "\n" not in str(info.value) and str(info.value).startswith("test.yaml:")


def test_engine_runs_a_multi_turn_workload():
    from servesim import simulate

    result = simulate({
        "hardware": "h100-sxm", "model": "llama-3.1-8b",
        "workload": multi_turn(num_sessions=10, system_prompts={"num_prompts": 2, "prompt_tokens": FIXED}),
    })
    assert result.summary["completed"] == result.summary["num_requests"] == len(result.requests) > 10
    assert (result.requests["prompt_tokens"].to_numpy() > 10).all()  # every prompt carries its system prompt


def test_a_dumped_azure_trace_config_validates_again():
    """capacity and sweeps validate a model_dump of the config, which writes bucket_policy: spread (the
    default) out: refusing any bucket_policy on an Azure trace broke every Azure capacity search."""
    first = cfg({"type": "trace", "path": "x.csv"})
    assert cfg(first.model_dump()).bucket_policy == "spread"


def test_every_shipped_run_config_validates_again_from_its_dump():
    """capacity, sweeps and deployments re-validate ``cfg.model_dump()``: a validator that treats a dumped
    default as the user's choice breaks them (bucket_policy on Azure traces did)."""
    from pathlib import Path

    import yaml

    from servesim.config.models import SimConfig, load_config, validate_config

    root = Path(__file__).resolve().parents[1]
    checked = 0
    for path in sorted((root / "experiments").rglob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not (isinstance(data, dict) and "hardware" in data):
            continue
        config, _ = load_config(path)
        again = validate_config(config.model_dump(), f"{path} (dumped)")
        assert isinstance(again, SimConfig) and again.model_dump() == config.model_dump(), path
        checked += 1
    assert checked >= 15


@pytest.mark.parametrize("system_prompts, message", [
    ({"num_prompts": 3, "prompt_lengths": [5, 6]}, "num_prompts (3) must equal the number of prompt_lengths (2)"),
    ({"prompt_tokens": FIXED}, "num_prompts is required with prompt_tokens"),
    ({"num_prompts": 2, "prompt_tokens": FIXED, "prompt_lengths": [5, 6]},
     "give exactly one of prompt_tokens (with num_prompts) and prompt_lengths"),
])
def test_a_system_prompts_check_names_its_section_once(system_prompts, message):
    # read "test.yaml: system_prompts: system_prompts: num_prompts (3) must equal ..."
    with pytest.raises(ConfigError) as info:
        cfg({**poisson_with_system_prompts(5), "system_prompts": system_prompts})
    assert str(info.value) == f"test.yaml: system_prompts: {message}"
