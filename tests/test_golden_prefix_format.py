"""The prefix-caching golden traces (``tests/data/golden/prefix_*.json.gz``) are consistent in themselves.

These traces are written by vLLM 0.32's scheduler with prefix caching on (``oracle/vllm_oracle.py``,
``oracle/README.md``); ``tests/test_golden_vllm.py`` replays them in servesim. This file checks, without
the engine, what must hold for any correct trace of its scenario, so that a trace that was written wrong,
edited by hand or left behind by a changed scenario does not pass unnoticed, and that each scenario
exercises the rule its description names:

* the scenario committed in ``oracle/scenarios/`` is the one the trace was written from;
* each request's segments (servesim content ids, ``servesim/workload/content.py``) cover its prompt and
  output and end with its own output;
* every prefix-cache hit (``new_computed``) is whole blocks, at most ``num_tokens - 1`` tokens, and no longer
  than the longest prefix the request shares with a request already scheduled (itself, when resumed after a
  preemption); with EAGLE's trailing-block drop, one block shorter;
* the step's ``PrefixCacheStats`` count exactly those admissions: first admissions as ``requests``, ``queries``
  (prompt tokens) and ``hits``, resumed ones as ``preempted_*``;
* the scenarios' own rules: hits happen where content is shared, a whole cached prompt hits
  ``num_tokens - 1`` rounded down to blocks, multi-turn hits reach into the previous turn's output, requests
  admitted in the same step share blocks, and with no shared content only preempted requests hit.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from servesim.workload.content import (
    NAMESPACE_MESSAGE,
    NAMESPACE_OUTPUT,
    NAMESPACE_SHIFT,
    NAMESPACE_SYSTEM_PROMPT,
    SequenceContent,
    content_id,
)

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
SCENARIOS = ROOT / "oracle" / "scenarios"
PREFIX_FILES = sorted(GOLDEN.glob("prefix_*.json.gz"))
NAMESPACES = {NAMESPACE_SYSTEM_PROMPT, NAMESPACE_MESSAGE, NAMESPACE_OUTPUT}
INDEX_MASK = (1 << NAMESPACE_SHIFT) - 1


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def content_of(requests: list[dict]) -> SequenceContent:
    """The scenario's requests as servesim's :class:`SequenceContent`."""
    counts = [len(r["segments"]) for r in requests]
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    ids = np.array([c for r in requests for c, _ in r["segments"]], dtype=np.uint64)
    tokens = np.array([t for r in requests for _, t in r["segments"]], dtype=np.int64)
    return SequenceContent(offsets, ids, tokens)


def admissions(golden: dict) -> list[dict]:
    """Every admission from WAITING in step order: step, request, hit (tokens), resumed (after a preemption),
    and the requests scheduled before it (earlier steps, or earlier in this step's order)."""
    out, seen = [], []
    for st in golden["steps"]:
        order = [r for r, _, _ in st["scheduled"]]
        hits = dict((r, h) for r, h in st["new_computed"])
        for pos, r in enumerate(order):
            if r in hits:
                out.append({"step": st["step"], "request": r, "hit": hits[r], "resumed": r in seen,
                            "before": set(seen) | set(order[:pos])})
        seen.extend(r for r in order if r not in seen)
    return out


def share_bound(content: SequenceContent, adm: dict, requests: list[dict], block_size: int, drop: bool) -> int:
    """The longest hit the admission could have: the prefix shared with a request scheduled before it (or,
    resumed, its own), capped at ``num_tokens - 1``, in whole blocks, one block less with EAGLE's drop."""
    r = adm["request"]
    if adm["resumed"]:  # its own blocks: at most its prompt and output so far, less the last token
        shared = requests[r]["prompt_tokens"] + requests[r]["output_tokens"] - 1
    else:
        shared = max((content.common_prefix_tokens(r, j) for j in adm["before"]), default=0)
        shared = min(shared, requests[r]["prompt_tokens"] - 1)
    blocks = shared // block_size
    return max(blocks - (1 if drop else 0), 0) * block_size


@pytest.fixture(scope="module", params=PREFIX_FILES, ids=[p.name.removesuffix(".json.gz") for p in PREFIX_FILES])
def golden(request) -> dict:
    return load(request.param)


def test_prefix_traces_exist():
    names = {p.name.removesuffix(".json.gz") for p in PREFIX_FILES}
    scenario_names = {p.stem for p in SCENARIOS.glob("prefix_*.json")}
    assert names == scenario_names and len(names) >= 10


def test_trace_is_of_the_committed_scenario(golden):
    scen = golden["scenario"]
    assert json.loads((SCENARIOS / f"{scen['name']}.json").read_text()) == scen
    assert scen["engine"]["enable_prefix_caching"] is True
    assert golden["vllm_config"]["enable_prefix_caching"] is True
    method = (scen.get("speculative_config") or {}).get("method")
    assert golden["vllm_config"]["use_eagle_block_drop"] == (method in ("eagle", "eagle3", "mtp"))


def test_segments_cover_prompt_and_output(golden):
    requests = golden["scenario"]["requests"]
    steps = [r["arrival_step"] for r in requests]
    assert steps == sorted(steps)
    for i, r in enumerate(requests):
        tokens = [t for _, t in r["segments"]]
        assert min(tokens) >= 1 and sum(tokens) == r["prompt_tokens"] + r["output_tokens"], f"request {i}"
        ids = [c for c, _ in r["segments"]]
        assert all(c >> NAMESPACE_SHIFT in NAMESPACES for c in ids), f"request {i}: unknown namespace"
        # the prompt ends where the request's own output starts
        assert ids[-1] == int(content_id(NAMESPACE_OUTPUT, i)) and tokens[-1] == r["output_tokens"]
        # messages and outputs are named after the request they first appear in: this one or an earlier one
        for c in ids[:-1]:
            if c >> NAMESPACE_SHIFT == NAMESPACE_OUTPUT:
                j = c & INDEX_MASK
                assert j < i, f"request {i} resends the output of request {j}, which arrives later"
                assert dict(map(tuple, requests[j]["segments"]))[c] >= dict(map(tuple, r["segments"]))[c]
            if c >> NAMESPACE_SHIFT == NAMESPACE_MESSAGE:
                assert c & INDEX_MASK <= i


def test_hits_are_whole_blocks_within_what_is_shared(golden):
    scen = golden["scenario"]
    requests, bs = scen["requests"], scen["engine"]["block_size"]
    content = content_of(requests)
    drop = golden["vllm_config"]["use_eagle_block_drop"]
    attained, shared = 0, 0
    for adm in admissions(golden):
        bound = share_bound(content, adm, requests, bs, drop)
        assert adm["hit"] % bs == 0, adm
        assert 0 <= adm["hit"] <= bound, (adm, bound)
        if not adm["resumed"]:
            attained += adm["hit"] == bound > 0
            shared += bound > 0
    # where requests share content, some hit is exactly what the rules allow (cap, blocks, drop)
    assert attained > 0 or shared == 0, "no hit reaches what is shared: the scenario pins no cap or alignment"


def test_prefix_cache_stats_count_the_admissions(golden):
    requests = golden["scenario"]["requests"]
    by_step: dict[int, list[dict]] = {}
    for adm in admissions(golden):
        by_step.setdefault(adm["step"], []).append(adm)
    for st in golden["steps"]:
        stats, adms = st["prefix_cache"], by_step.get(st["step"], [])
        first = [a for a in adms if not a["resumed"]]
        again = [a for a in adms if a["resumed"]]
        assert stats["requests"] == len(first) and stats["preempted_requests"] == len(again), st["step"]
        assert stats["queries"] == sum(requests[a["request"]]["prompt_tokens"] for a in first)
        assert stats["hits"] == sum(a["hit"] for a in first) <= stats["queries"]
        assert stats["preempted_hits"] == sum(a["hit"] for a in again)
        assert stats["preempted_hits"] <= stats["preempted_queries"]
        # a resumed request's query is its whole sequence so far: its prompt and the output it had
        assert sum(requests[a["request"]]["prompt_tokens"] for a in again) <= stats["preempted_queries"]
        assert stats["preempted_queries"] <= sum(requests[a["request"]]["prompt_tokens"]
                                                 + requests[a["request"]]["output_tokens"] - 1 for a in again)
        assert 0 <= st["kv_blocks_used"] <= golden["scenario"]["engine"]["num_gpu_blocks"] - 1


def named(name: str) -> dict:
    return load(GOLDEN / f"{name}.json.gz")


def totals(golden: dict) -> dict:
    keys = golden["steps"][0]["prefix_cache"]
    return {k: sum(st["prefix_cache"][k] for st in golden["steps"]) for k in keys}


def test_shared_system_prompt_hits_whole_blocks_of_it():
    golden = named("prefix_shared_system_prompt")
    hits = {h for st in golden["steps"] for _, h in st["new_computed"]}
    assert {96, 32} <= hits and totals(golden)["hits"] > 0  # 100 and 40 tokens: 6 and 2 whole blocks


def test_whole_cached_prompt_recomputes_its_last_block():
    golden = named("prefix_whole_prompt_cached")
    requests = golden["scenario"]["requests"]
    later = [a for a in admissions(golden) if a["request"] > 0]
    assert {requests[a["request"]]["prompt_tokens"] for a in later} >= {64, 65}
    for adm in later:
        prompt = requests[adm["request"]]["prompt_tokens"]
        assert adm["hit"] == (prompt - 1) // 16 * 16  # 64 -> 48, 65 and 66 -> 64


def test_eagle_drops_the_last_matching_block():
    hits = {h for st in named("prefix_eagle_k3")["steps"] for _, h in st["new_computed"]}
    assert 80 in hits and 96 not in hits  # the 100-token system prompt: 6 blocks match, 5 are used
    golden = named("prefix_eagle_whole_prompt_cached")
    requests = golden["scenario"]["requests"]
    later = [a for a in admissions(golden) if a["request"] > 0]
    assert {requests[a["request"]]["prompt_tokens"] for a in later} >= {64, 65}
    for adm in later:  # the num_tokens - 1 cap, whole blocks, then one block less: 64 -> 32, 65 and 66 -> 48
        assert adm["hit"] == ((requests[adm["request"]]["prompt_tokens"] - 1) // 16 - 1) * 16


def test_without_chunked_prefill_hits_let_prompts_fit_the_budget():
    golden = named("prefix_no_chunked_prefill")
    requests, budget = golden["scenario"]["requests"], golden["scenario"]["engine"]["max_num_batched_tokens"]
    first = golden["steps"][0]
    assert sum(requests[r]["prompt_tokens"] for r, _ in first["new_computed"]) > budget
    scheduled = {r: n for r, n, _ in first["scheduled"]}
    for r, hit in first["new_computed"]:  # each admitted whole: all of its prompt after the hit
        assert scheduled[r] == requests[r]["prompt_tokens"] - hit
    assert sum(scheduled.values()) <= budget


def test_multi_turn_hits_reach_into_the_previous_output():
    for name in ("prefix_multi_turn", "prefix_multi_turn_bs32", "prefix_eagle_multi_turn"):
        golden = named(name)
        requests = golden["scenario"]["requests"]
        last_step = {}
        for st in golden["steps"]:
            for r, _, _ in st["scheduled"]:
                last_step[r] = st["step"]
        reach = 0
        for adm in admissions(golden):
            r = requests[adm["request"]]
            start = 0
            for c, t in r["segments"][:-1]:
                if c >> NAMESPACE_SHIFT == NAMESPACE_OUTPUT:
                    assert r["arrival_step"] > last_step[c & INDEX_MASK], f"{name}: a turn before its history"
                    reach += adm["hit"] > start
                start += t
        assert reach > 0, f"{name}: no hit reaches a previous turn's output"


def test_same_step_admissions_share_blocks():
    golden = named("prefix_same_step")
    first = golden["steps"][0]
    assert len(first["new_computed"]) >= 3 and first["new_computed"][0][1] == 0
    assert all(h > 0 for _, h in first["new_computed"][1:])  # hits on blocks allocated in this very step


def test_blocks_of_a_last_chunk_are_hit_in_its_own_step():
    golden = named("prefix_chunked_long_prompt")
    requests = golden["scenario"]["requests"]
    last_chunk = next(st for st in golden["steps"] if sum(n for r, n, _ in st["scheduled"] if r == 0) < 64)
    assert last_chunk["new_computed"] == [[1, 352]]  # the 22 tokens of budget left; 320 before this chunk
    assert requests[0]["prompt_tokens"] - 320 == last_chunk["scheduled"][0][1]


def test_without_shared_content_only_preempted_requests_hit():
    golden = named("prefix_unique_tight_kv")
    sums = totals(golden)
    assert sums["hits"] == 0 and sums["preempted_requests"] > 0 and sums["preempted_hits"] > 0


def test_partial_prefill_rehits_its_chunks():
    golden = named("prefix_long_prompts_tight_kv")
    requests = golden["scenario"]["requests"]
    resumed = [a for a in admissions(golden) if a["resumed"]]
    # a request resumed with a hit beyond the shared prefix but short of its prompt: its own chunks' blocks
    assert any(64 < a["hit"] < requests[a["request"]]["prompt_tokens"] - 16 for a in resumed)


def test_tight_pools_preempt_and_rehit():
    for name in ("prefix_tight_kv", "prefix_eagle_tight_kv", "prefix_async_tight_kv", "prefix_long_prompts_tight_kv"):
        golden = named(name)
        assert any(st["preempted"] for st in golden["steps"]), name
        assert totals(golden)["preempted_hits"] > 0, name
