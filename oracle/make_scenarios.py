"""Write the golden scenarios (``oracle/scenarios/*.json``), deterministically from fixed seeds.

Run with any Python >= 3.11 with numpy (the oracle's venv or servesim's)::

    oracle/.venv/bin/python oracle/make_scenarios.py

Each scenario is small (4-24 requests, tens to a few hundred steps) and aims at one scheduling rule; the
list at the bottom says which. ``accept`` gives, per request, the drafts accepted in each verification
round when enough were drafted (``A_j`` in 0..K, drawn with a per-position acceptance of about 0.7;
``-1`` = an n-gram round without a match, about 30% of n-gram rounds). One entry per output token is
always enough: every round emits at least one token.

Prefix-caching scenarios (``prefix_*``, ``engine.enable_prefix_caching``) also say which tokens each request
holds: ``segments`` = ``[[content id, tokens], ...]`` over its prompt then its output, with servesim's content
ids (``servesim/workload/content.py``: ``namespace << 56 | index``; shared system prompt ``k`` =
``NAMESPACE_SYSTEM_PROMPT, k``; a request's own message and output = ``NAMESPACE_MESSAGE`` /
``NAMESPACE_OUTPUT`` with the index of the request they first appear in). The oracle turns them into token
ids (``oracle/vllm_oracle.py``, ``content_token``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent / "scenarios"


def requests(seed: int, n: int, prompt: tuple[int, int], output: tuple[int, int], arrivals: str | list = "spread",
             k: int = 0, empty_share: float = 0.0, alpha: float = 0.7) -> list[dict]:
    """``n`` requests with uniform prompt/output lengths in the given inclusive ranges."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    prompts = rng.integers(prompt[0], prompt[1] + 1, n)
    outputs = rng.integers(output[0], output[1] + 1, n)
    steps = arrival_steps(rng, n, arrivals)
    out = []
    for i in range(n):
        row = {"arrival_step": int(steps[i]), "prompt_tokens": int(prompts[i]), "output_tokens": int(outputs[i])}
        if k:
            row["accept"] = accept_rounds(rng, int(outputs[i]), k, alpha, empty_share)
        out.append(row)
    return out


def arrival_steps(rng, n: int, arrivals: str | list) -> np.ndarray:
    """Arrival steps: ``spread`` (sorted uniform over ``0..4n``, the first at 0), ``burst`` (half at 0, half at
    40), ``zero``, or the given list."""
    if arrivals == "spread":
        steps = np.sort(rng.integers(0, 4 * n, n))
        steps[0] = 0
    elif arrivals == "burst":
        steps = np.zeros(n, dtype=int)
        steps[n // 2:] = 40
    elif arrivals == "zero":
        steps = np.zeros(n, dtype=int)
    else:
        steps = np.asarray(arrivals)
    return steps


def accept_rounds(rng, outputs: int, k: int, alpha: float = 0.7, empty_share: float = 0.0) -> list[int]:
    """``A_j`` for ``outputs`` rounds: accepted drafts of ``k`` at per-position acceptance ``alpha``, ``-1``
    (n-gram: no match) with probability ``empty_share``."""
    u = rng.random((outputs, k))
    acc = np.cumprod(u < alpha, axis=1).sum(axis=1)
    if empty_share:
        acc[rng.random(outputs) < empty_share] = -1
    return [int(a) for a in acc]


def engine(seqs=8, tokens=256, blocks=64, block_size=16, chunked=True, async_scheduling=False, max_model_len=8192,
           prefix=False):
    out = {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "num_gpu_blocks": blocks, "block_size": block_size,
           "enable_chunked_prefill": chunked, "async_scheduling": async_scheduling, "max_model_len": max_model_len}
    if prefix:
        out["enable_prefix_caching"] = True
    return out


# servesim's content-id namespaces (servesim/workload/content.py), copied: this script does not import servesim
NAMESPACE_SYSTEM_PROMPT = 2
NAMESPACE_MESSAGE = 3
NAMESPACE_OUTPUT = 4
NAMESPACE_SHIFT = 56


def content_id(namespace: int, index: int) -> int:
    return namespace << NAMESPACE_SHIFT | index


def with_content(turns: list[dict], seed: int, k: int = 0, empty_share: float = 0.0) -> list[dict]:
    """Requests with ``segments`` from symbolic turns, in arrival order.

    Each turn: ``{"key", "arrival_step", "parts": [("system", k, tokens) | ("message", key, tokens) |
    ("output", key, tokens)], "output_tokens"}``; its own output (``("output", its key, output_tokens)``) is
    appended. A message or output is named by the index of the request it first appears in (its key's).
    """
    turns = sorted(turns, key=lambda r: r["arrival_step"])  # stable: request ids in arrival order
    index = {r["key"]: i for i, r in enumerate(turns)}
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    spaces = {"system": NAMESPACE_SYSTEM_PROMPT, "message": NAMESPACE_MESSAGE, "output": NAMESPACE_OUTPUT}
    out = []
    for r in turns:
        segments = []
        for kind, ref, tokens in r["parts"]:
            idx = ref if kind == "system" else index[ref]
            segments.append([content_id(spaces[kind], idx), int(tokens)])
        prompt = sum(s[1] for s in segments)
        segments.append([content_id(NAMESPACE_OUTPUT, index[r["key"]]), int(r["output_tokens"])])
        row = {"arrival_step": int(r["arrival_step"]), "prompt_tokens": int(prompt),
               "output_tokens": int(r["output_tokens"]), "segments": segments}
        if k:
            row["accept"] = accept_rounds(rng, int(r["output_tokens"]), k, empty_share=empty_share)
        out.append(row)
    return out


def shared_prompt_turns(seed: int, n: int, system: list[int], message: tuple[int, int], output: tuple[int, int],
                        arrivals: str | list = "spread", share: float = 1.0, key: str = "s") -> list[dict]:
    """``n`` requests, each a system prompt (one of ``system``: their lengths, picked uniformly; none with
    probability ``1 - share``) followed by its own message."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    msgs = rng.integers(message[0], message[1] + 1, n)
    outs = rng.integers(output[0], output[1] + 1, n)
    which = rng.integers(0, len(system), n)
    shared = rng.random(n) < share
    steps = arrival_steps(rng, n, arrivals)
    turns = []
    for i in range(n):
        parts = [("system", int(which[i]), system[which[i]])] if shared[i] else []
        if msgs[i] > 0:
            parts.append(("message", f"{key}{i}", int(msgs[i])))
        turns.append({"key": f"{key}{i}", "arrival_step": int(steps[i]), "parts": parts,
                      "output_tokens": int(outs[i])})
    return turns


def conversation_turns(seed: int, sessions: int, turns: int, system: int, message: tuple[int, int],
                       output: tuple[int, int], gap: int, start_every: int = 5, budget: int = 256) -> list[dict]:
    """Multi-turn conversations: turn ``t + 1``'s prompt = turn ``t``'s prompt + its output + a new message.

    Turn ``t + 1`` arrives ``gap`` to ``gap + 5`` steps after turn ``t`` is sure to have finished
    (its prefill chunks at the whole budget ``budget`` and one step per output token, counted generously).
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    out = []
    for s in range(sessions):
        parts = [("system", 0, system)] if system else []
        step = s * start_every
        for t in range(turns):
            key = f"c{s}t{t}"
            parts = parts + [("message", key, int(rng.integers(message[0], message[1] + 1)))]
            outputs = int(rng.integers(output[0], output[1] + 1))
            out.append({"key": key, "arrival_step": step, "parts": parts, "output_tokens": outputs})
            prompt = sum(p[2] for p in parts)
            step += 2 * (-(-prompt // budget)) * sessions + outputs + gap + int(rng.integers(0, 6))
            parts = parts + [("output", key, outputs)]
    return out


def fuzz_scenario(seed: int, index: int) -> dict:
    """Scenario ``index`` of ``oracle/fuzz.py``'s seed ``seed`` (its generator: numpy only)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from fuzz import scenarios as fuzz_scenarios

    return fuzz_scenarios(seed, index + 1)[index]


def spec(method, k, table=None, layers=None):
    out = {"method": method, "num_speculative_tokens": k}
    if table is not None:
        out["num_speculative_tokens_per_batch_size"] = table
    if layers is not None:
        out["num_nextn_predict_layers"] = layers
    return out


def scenarios() -> list[dict]:
    S = []

    def add(name, what, eng, reqs, sp=None):
        reqs = sorted(reqs, key=lambda r: r["arrival_step"])  # request ids are in arrival order
        S.append({"name": name, "description": what, "engine": eng, "speculative_config": sp, "requests": reqs})

    # --- plain decoding
    add("plain_decode", "plain decoding, ample KV cache, spread arrivals",
        engine(), requests(1, 8, (20, 90), (5, 40)))
    add("plain_tight_kv", "tight KV pool: many preemptions by recompute, victims at the front of the queue",
        engine(blocks=20), requests(2, 12, (20, 70), (30, 90)))
    add("plain_tight_kv_bs32", "tight KV pool with 32-token blocks",
        engine(blocks=12, block_size=32), requests(3, 10, (20, 90), (30, 100)))
    add("plain_max_num_seqs", "the max_num_seqs cap (3) with 10 waiting requests",
        engine(seqs=3), requests(4, 10, (10, 60), (10, 40), arrivals="zero"))
    add("plain_small_budget", "token budget 8 = max_num_seqs: prompts chunked to what decodes leave",
        engine(seqs=8, tokens=8), requests(5, 8, (10, 40), (5, 20)))
    add("plain_burst", "two bursts of 8 requests (steps 0 and 40)",
        engine(blocks=40), requests(6, 16, (10, 60), (10, 50), arrivals="burst"))
    add("plain_bs32", "32-token blocks, ample KV cache",
        engine(block_size=32), requests(7, 8, (20, 120), (10, 40)))
    add("plain_no_chunked_prefill", "chunked prefill off: a prompt is admitted only whole within the budget",
        engine(tokens=160, chunked=False, max_model_len=160, blocks=40), requests(8, 10, (20, 100), (5, 50)))
    add("plain_long_prompts", "prompts longer than the token budget (64), chunked over several steps",
        engine(tokens=64), requests(9, 6, (100, 300), (5, 20)))
    add("plain_one_token_outputs", "1-token outputs (finish at their prefill step) mixed with longer ones",
        engine(), requests(10, 10, (10, 60), (1, 1)) + requests(11, 3, (10, 30), (5, 10), arrivals=[3, 5, 7]))
    add("plain_long_prompts_tight_kv", "long chunked prompts in a tight pool: preemption of the partial prefill",
        engine(tokens=64, blocks=30), requests(12, 8, (60, 200), (20, 60)))
    add("plain_admission_whole_prompt", "admission needs the whole prompt's blocks free, not just its first chunk",
        engine(tokens=32, blocks=26), requests(13, 6, (150, 250), (10, 30), arrivals="zero"))
    # --- speculative decoding, each method
    add("ngram_empty_drafts", "n-gram k=3 with empty drafts (no match) in about 30% of rounds",
        engine(), requests(20, 8, (20, 80), (10, 50), k=3, empty_share=0.3), spec("ngram", 3))
    add("ngram_tight_kv", "n-gram k=4 in a tight pool (no lookahead slots)",
        engine(blocks=20), requests(21, 10, (20, 60), (30, 80), k=4, empty_share=0.3), spec("ngram", 4))
    add("eagle_k3", "EAGLE k=3, lookahead slots = k",
        engine(), requests(22, 8, (20, 80), (10, 60), k=3), spec("eagle", 3))
    add("eagle_tight_kv", "EAGLE k=3 in a tight pool: preemptions with lookahead slots",
        engine(blocks=24), requests(23, 10, (20, 60), (30, 80), k=3), spec("eagle", 3))
    add("eagle_small_budget", "EAGLE k=4 with a token budget (16) below batch x (1 + k): drafts truncated",
        engine(seqs=6, tokens=16), requests(24, 6, (10, 40), (20, 40), arrivals="zero", k=4), spec("eagle", 4))
    add("eagle_bs32", "EAGLE k=2 with 32-token blocks, tight pool",
        engine(blocks=14, block_size=32), requests(25, 8, (20, 80), (20, 60), k=2), spec("eagle", 2))
    add("eagle_no_chunked_prefill", "EAGLE k=3, chunked prefill off",
        engine(tokens=160, chunked=False, max_model_len=160, blocks=40),
        requests(26, 8, (20, 100), (10, 50), k=3), spec("eagle", 3))
    add("eagle_one_token_outputs", "EAGLE k=3 with 1-2 token outputs",
        engine(), requests(27, 10, (10, 50), (1, 2), k=3), spec("eagle", 3))
    add("eagle_burst", "EAGLE k=3, two bursts of 8",
        engine(blocks=50), requests(28, 16, (10, 60), (10, 50), arrivals="burst", k=3), spec("eagle", 3))
    add("eagle3_k4", "EAGLE-3 k=4",
        engine(blocks=40), requests(29, 8, (20, 80), (20, 60), k=4), spec("eagle3", 4))
    add("mtp1_k1", "MTP with 1 layer, k=1",
        engine(blocks=30), requests(30, 8, (20, 80), (20, 60), k=1), spec("mtp", 1, layers=1))
    add("mtp3_k3_chunked", "MTP with 3 layers, k=3: a prefill chunk never ends within k tokens of the prompt's end",
        engine(tokens=48), requests(31, 8, (40, 160), (10, 40), k=3), spec("mtp", 3, layers=3))
    add("mtp3_k3_tight_kv", "MTP with 3 layers, k=3, small budget and tight pool",
        engine(tokens=32, blocks=30), requests(32, 8, (30, 120), (20, 50), k=3), spec("mtp", 3, layers=3))
    add("draft_model_k4", "draft model k=4: one extra slot per scheduled request out of the token budget",
        engine(blocks=40), requests(33, 8, (20, 80), (20, 60), k=4), spec("draft_model", 4))
    add("draft_model_small_budget", "draft model k=3, budget 24: the per-request drafting slot shortens chunks",
        engine(seqs=6, tokens=24), requests(34, 8, (20, 90), (10, 40), k=3), spec("draft_model", 3))
    add("medusa_k3_tight_kv", "Medusa k=3: vLLM reserves no lookahead slots; tight pool",
        engine(blocks=22), requests(35, 10, (20, 60), (30, 80), k=3), spec("medusa", 3))
    adm = requests(104, 8, (2, 6), (20, 60), k=3)
    for r in adm:
        r["prompt_tokens"] *= 16  # whole blocks: the lookahead slots need one more block than the prompt
    add("eagle_admission_lookahead", "EAGLE k=3, prompts of whole blocks, tight pool: admission checks the whole "
        "prompt's blocks and the first chunk's blocks plus lookahead, not the prompt plus lookahead",
        engine(tokens=32, blocks=22), adm, spec("eagle", 3))
    ends = requests(100, 8, (1, 4), (10, 40), k=3)
    for i, r in enumerate(ends):
        r["prompt_tokens"] = r["prompt_tokens"] * 32 + 1 + i % 3  # chunks of 32 would end 1-3 tokens short
    add("mtp3_k3_chunk_ends", "MTP with 3 layers, k=3, prompts 1-3 tokens past a multiple of the budget (32): "
        "chunks are cut back so that none ends within 3 tokens of the prompt's end",
        engine(tokens=32, blocks=60), ends, spec("mtp", 3, layers=3))
    add("eagle_k4_preempt_no_admission", "EAGLE k=4, very tight pool: no admission in a step that preempted, "
        "although the victim's whole sequence would fit again (admission does not count lookahead slots)",
        engine(tokens=64, blocks=18, seqs=6), requests(300, 10, (8, 40), (20, 80), k=4), spec("eagle", 4))
    # --- batch-size-dependent k
    add("eagle_table_k0", "k table with k=0 above 3 requests (lookahead slots stay at K)",
        engine(blocks=60), requests(36, 8, (10, 60), (20, 60), k=3),
        spec("eagle", 3, table=[[1, 3, 3], [4, 64, 0]]))
    add("eagle_table_flip", "k table whose lookup flips when one prefill joins 4 decoders ([1,4]->3, [5,..]->1)",
        engine(blocks=60), requests(37, 4, (20, 40), (60, 90), arrivals="zero", k=3)
        + requests(38, 4, (20, 40), (3, 6), arrivals=[20, 45, 70, 95], k=3),
        spec("eagle", 3, table=[[1, 4, 3], [5, 64, 1]]))
    add("ngram_table", "n-gram with a k table and empty drafts",
        engine(), requests(39, 8, (20, 60), (10, 50), k=4, empty_share=0.3),
        spec("ngram", 4, table=[[1, 2, 4], [3, 5, 2], [6, 64, 1]]))
    add("draft_model_table", "draft model with a k table including k=0",
        engine(blocks=50), requests(40, 8, (20, 60), (10, 50), k=3),
        spec("draft_model", 3, table=[[1, 2, 3], [3, 4, 1], [5, 64, 0]]))
    # --- async scheduling (vLLM's default on GPUs for plain decoding, EAGLE, MTP and draft models)
    add("async_plain", "async scheduling, plain decoding",
        engine(async_scheduling=True), requests(50, 8, (20, 90), (5, 40)))
    add("async_plain_tight_kv", "async scheduling, tight KV pool with preemptions",
        engine(blocks=20, async_scheduling=True), requests(51, 12, (20, 70), (30, 90)))
    add("async_eagle", "async scheduling, EAGLE k=3",
        engine(async_scheduling=True), requests(52, 8, (20, 80), (10, 60), k=3), spec("eagle", 3))
    add("async_eagle_tight_kv", "async scheduling, EAGLE k=3, tight pool: allocation counts the previous step's "
        "drafts as accepted; preemptions",
        engine(blocks=24, async_scheduling=True), requests(53, 10, (20, 60), (30, 80), k=3), spec("eagle", 3))
    add("async_draft_model_small_budget", "async scheduling, draft model k=3, budget 24",
        engine(seqs=6, tokens=24, async_scheduling=True), requests(54, 8, (20, 90), (10, 40), k=3),
        spec("draft_model", 3))
    add("async_mtp3_k3", "async scheduling, MTP with 3 layers, k=3, small budget",
        engine(tokens=48, blocks=40, async_scheduling=True), requests(55, 8, (40, 160), (10, 40), k=3),
        spec("mtp", 3, layers=3))
    add("async_eagle_table", "async scheduling, EAGLE with a k table including k=0",
        engine(blocks=60, async_scheduling=True), requests(56, 8, (10, 60), (20, 60), k=3),
        spec("eagle", 3, table=[[1, 3, 3], [4, 64, 0]]))
    add("async_plain_max_num_seqs", "async scheduling, max_num_seqs=3 and 1-3 token outputs: finished requests "
        "hold their slot and blocks while the next step is scheduled",
        engine(seqs=3, blocks=30, async_scheduling=True), requests(57, 10, (10, 60), (1, 3), arrivals="zero"))
    # --- max_model_len within K + lookahead of a request's end (found by oracle/fuzz.py)
    near = requests(60, 8, (20, 60), (20, 40), k=4)
    for i, r in enumerate(near):
        r["prompt_tokens"] = 128 - r["output_tokens"] - i % 6  # prompt + output = 128 - (0..5)
    add("eagle_max_model_len", "EAGLE k=4, max_model_len 128, requests ending 0-5 tokens short of it: a verify "
        "never reaches past position max_model_len - 1 (drafts cut to max_model_len - num_computed - 2) and the "
        "KV slots, lookahead included, stop at max_model_len (8 blocks, not 9)",
        engine(seqs=4, blocks=40, max_model_len=128), near, spec("eagle", 4))
    nochunk = requests(61, 8, (20, 60), (10, 30), k=3, empty_share=0.3)
    for i, r in enumerate(nochunk):
        r["prompt_tokens"] = 96 - r["output_tokens"] - i % 4
    add("async_eagle_max_model_len", "async scheduling, EAGLE k=4, max_model_len 128, requests ending 0-5 tokens "
        "short of it: the bound max_model_len - num_computed - 1 counts the previous step's drafts in flight, so "
        "a request whose drafts were rejected verifies fewer, or is skipped for a step when no token is left",
        engine(seqs=4, blocks=40, max_model_len=128, async_scheduling=True), near, spec("eagle", 4))
    fuzzed = fuzz_scenario(1, 32)  # oracle/fuzz.py's scenario fuzz_s1_32
    add("async_draft_model_max_model_len_empty_step", "async scheduling, draft model k=1, prefix caching, chunked "
        "prefill off, max_model_len = budget = 202 (fuzz_s1_32): every running request is skipped at "
        "max_model_len while its previous output is in flight, an empty step; vLLM processes that output and "
        "schedules again", fuzzed["engine"], fuzzed["requests"], fuzzed["speculative_config"])
    fuzzed = fuzz_scenario(6, 140)
    add("async_eagle_empty_step_preemption", "async scheduling, EAGLE k=3, a tight pool (fuzz_s6_140): a schedule() "
        "call preempts and schedules nothing (the finished request's last output still in flight); its victim is "
        "traced with the next step, which readmits it", fuzzed["engine"], fuzzed["requests"],
        fuzzed["speculative_config"])
    add("ngram_max_model_len_no_chunked_prefill", "n-gram k=3, chunked prefill off with max_model_len = budget = "
        "96 and requests ending 0-3 tokens short of it: drafts cut at the context's end",
        engine(tokens=96, chunked=False, max_model_len=96, blocks=30), nochunk, spec("ngram", 3))
    prefix_scenarios(add)
    return S


def prefix_scenarios(add) -> None:
    """Prefix caching on (``engine.enable_prefix_caching``), each scenario with the rule it pins."""
    pc = dict(prefix=True)
    # --- a shared system prompt: hits, their block alignment, the num_tokens - 1 cap
    add("prefix_shared_system_prompt", "a 100-token system prompt shared by 16 requests (6 full blocks): later "
        "requests hit 96 tokens (block-aligned, not 100) once the first one's prefill has computed them; a second "
        "system prompt of 40 tokens (2 blocks) for some",
        engine(**pc), with_content(shared_prompt_turns(200, 16, [100, 40], (10, 60), (5, 30)), 200))
    whole = shared_prompt_turns(201, 12, [64], (0, 2), (5, 20))  # prompt = 64, 65 or 66 tokens
    add("prefix_whole_prompt_cached", "prompts of exactly a cached 64-token system prompt (4 blocks), or 1-2 tokens "
        "more: a whole cached prompt hits num_tokens - 1 rounded down to blocks (48 of 64); 65 tokens hit 64",
        engine(**pc), with_content(whole, 201))
    # --- multi-turn: the next turn's prompt holds the previous turn's output (decode blocks cached)
    add("prefix_multi_turn", "3 conversations of 4 turns (turn t+1 = turn t's prompt + its output + a new message, "
        "arriving after turn t finished): hits reach into the previous turn's output, whose decode blocks were "
        "cached as they filled (the last output token has no KV)",
        engine(**pc), with_content(conversation_turns(210, 3, 4, 37, (10, 40), (10, 40), gap=3), 210))
    # --- tight KV pool: preemptions, LRU eviction of cached blocks
    add("prefix_tight_kv", "tight KV pool (30 blocks) with a shared 48-token system prompt: preemptions, a "
        "preempted request re-hitting its own freed blocks, freed blocks evicted LRU (tail blocks first: freed in "
        "reverse order), cached blocks counted as free",
        engine(blocks=30, **pc), with_content(shared_prompt_turns(220, 12, [48], (10, 50), (30, 80)), 220))
    add("prefix_unique_tight_kv", "prefix caching with no shared content (every prompt its own message), tight "
        "pool: the only hits are preempted requests re-hitting their own blocks (counted as preempted_* stats)",
        engine(blocks=20, **pc), with_content(shared_prompt_turns(221, 12, [1], (20, 70), (30, 90), share=0.0), 221))
    add("prefix_long_prompts_tight_kv", "long chunked prompts (budget 48) in a tight pool (24 blocks), a 64-token "
        "shared prefix: a partial prefill is preempted and resumed, re-hitting the blocks its chunks had filled",
        engine(tokens=48, blocks=24, **pc),
        with_content(shared_prompt_turns(226, 10, [64], (40, 150), (20, 60)), 226))
    # --- same-step sharing
    same = shared_prompt_turns(230, 4, [80], (5, 30), (5, 20), arrivals=[0, 0, 0, 0])
    same += shared_prompt_turns(231, 3, [50], (5, 30), (5, 20), arrivals=[30, 30, 30], key="t")
    add("prefix_same_step", "requests with the same system prompt arriving in the same step: the first admitted "
        "caches its blocks at allocation, so the next ones admitted in that step already hit them",
        engine(**pc), with_content(same, 230))
    # --- chunked prefill of a long shared prompt
    longp = shared_prompt_turns(240, 6, [352], (5, 40), (5, 20), arrivals=[0, 1, 2, 4, 7, 12])
    longp[0]["parts"][-1] = ("message", "s0", 10)  # chunks 64 x 5, then 42 tokens: 22 of the budget left
    add("prefix_chunked_long_prompt", "a 352-token shared prompt with a 64-token budget: the first request's "
        "chunks take the whole budget until its last one (42 tokens), whose blocks are cached at allocation, so "
        "the request admitted with the 22 tokens left in that step hits all 352 shared tokens (not the 320 of "
        "the earlier chunks)",
        engine(tokens=64, **pc), with_content(longp, 240))
    # --- 32-token blocks
    bs32 = shared_prompt_turns(250, 10, [75, 150], (10, 50), (5, 30))
    add("prefix_bs32", "32-token blocks: a 75-token and a 150-token shared prompt hit 64 and 128 tokens",
        engine(block_size=32, **pc), with_content(bs32, 250))
    add("prefix_multi_turn_bs32", "multi-turn conversations with 32-token blocks, tight pool",
        engine(block_size=32, blocks=24, **pc),
        with_content(conversation_turns(251, 3, 3, 20, (10, 40), (20, 50), gap=3), 251))
    # --- speculative decoding with prefix caching
    add("prefix_eagle_k3", "EAGLE k=3 with a shared system prompt: vLLM drops the last matching block of every "
        "hit (use_eagle_block_drop), so a 100-token prompt hits 80, not 96",
        engine(**pc), with_content(shared_prompt_turns(260, 12, [100], (10, 50), (10, 40)), 260, k=3),
        spec("eagle", 3))
    add("prefix_eagle_multi_turn", "EAGLE k=3, multi-turn conversations: block drop on decode-block hits",
        engine(**pc), with_content(conversation_turns(261, 3, 4, 30, (10, 40), (10, 40), gap=3), 261, k=3),
        spec("eagle", 3))
    add("prefix_eagle_tight_kv", "EAGLE k=3, tight pool: preemptions and re-hits with the block drop",
        engine(blocks=30, **pc), with_content(shared_prompt_turns(262, 10, [48], (10, 40), (30, 70)), 262, k=3),
        spec("eagle", 3))
    add("prefix_ngram_k3", "n-gram k=3 with a shared system prompt and multi-turn conversations: no block drop, "
        "no lookahead slots",
        engine(**pc), with_content(shared_prompt_turns(270, 8, [100], (10, 50), (10, 40))
                                   + conversation_turns(271, 2, 3, 0, (10, 40), (10, 30), gap=3, start_every=7),
                                   270, k=3, empty_share=0.3),
        spec("ngram", 3))
    add("prefix_mtp3_k3", "MTP with 3 layers, k=3, shared system prompt and a small budget: block drop, and the "
        "last num_speculative_tokens - 1 computed tokens are not cached yet",
        engine(tokens=48, blocks=60, **pc),
        with_content(shared_prompt_turns(280, 8, [100], (10, 50), (10, 40)), 280, k=3),
        spec("mtp", 3, layers=3))
    add("prefix_eagle_whole_prompt_cached", "EAGLE k=3, prompts of exactly a cached 64-token prompt or 1-2 tokens "
        "more: the num_tokens - 1 cap, then the block drop (64 -> 32; 65, 66 -> 48)",
        engine(**pc), with_content(shared_prompt_turns(263, 10, [64], (0, 2), (5, 20)), 263, k=3), spec("eagle", 3))
    add("prefix_draft_model_k3", "draft model k=3 with a shared system prompt: no block drop, one budget slot "
        "per scheduled request; budget 96 so that hits decide how many prompts fit in a step",
        engine(tokens=96, **pc),
        with_content(shared_prompt_turns(264, 10, [100], (10, 50), (10, 40), arrivals="zero"), 264, k=3),
        spec("draft_model", 3))
    # --- chunked prefill off: a prompt is admitted only if what is left after its hit fits the budget
    nochunk = shared_prompt_turns(265, 12, [112], (5, 40), (5, 30), arrivals=[0] * 6 + [30] * 6)
    nochunk[0]["parts"][-1] = ("message", "s0", 8)  # the first prompt (120 tokens) fits the budget whole
    add("prefix_no_chunked_prefill", "chunked prefill off, budget 200, bursts of 6 with a 112-token shared prompt: "
        "each prompt is admitted whole if its tokens after the hit fit what is left of the budget",
        engine(tokens=200, chunked=False, max_model_len=200, **pc), with_content(nochunk, 265))
    # --- async scheduling
    add("prefix_async_plain", "async scheduling with a shared system prompt and multi-turn conversations",
        engine(async_scheduling=True, **pc),
        with_content(shared_prompt_turns(290, 8, [100], (10, 50), (5, 30))
                     + conversation_turns(291, 2, 3, 0, (10, 40), (10, 30), gap=3, start_every=7), 290))
    add("prefix_async_tight_kv", "async scheduling, tight pool with a shared system prompt: preemptions and re-hits",
        engine(blocks=30, async_scheduling=True, **pc),
        with_content(shared_prompt_turns(292, 12, [48], (10, 50), (30, 80)), 292))
    add("prefix_async_eagle", "async scheduling, EAGLE k=3, shared system prompt and multi-turn conversations",
        engine(async_scheduling=True, **pc),
        with_content(shared_prompt_turns(293, 8, [100], (10, 50), (10, 40))
                     + conversation_turns(294, 2, 3, 0, (10, 40), (10, 30), gap=3, start_every=7), 293, k=3),
        spec("eagle", 3))
    # turns whose P + O - 1 is a multiple of 16: the output processed after the last step caches the block its
    # last computed token fills; the follow-up (arriving after the turn finished) hits it
    fin = [{"key": "f0", "arrival_step": 0, "parts": [("message", "f0", 40)], "output_tokens": 9},
           {"key": "f1", "arrival_step": 2, "parts": [("system", 0, 30), ("message", "f1", 25)], "output_tokens": 10},
           {"key": "f2", "arrival_step": 30, "parts": [("message", "f0", 40), ("output", "f0", 9),
                                                       ("message", "f2", 20)], "output_tokens": 12},
           {"key": "f3", "arrival_step": 32, "parts": [("system", 0, 30), ("message", "f1", 25),
                                                       ("output", "f1", 10), ("message", "f3", 30)],
            "output_tokens": 4},
           {"key": "f4", "arrival_step": 60, "parts": [("message", "f0", 40), ("output", "f0", 9),
                                                       ("message", "f2", 20), ("output", "f2", 12),
                                                       ("message", "f4", 15)], "output_tokens": 17}]
    add("prefix_async_finished_block", "async scheduling, multi-turn turns with prompt + output - 1 a multiple of "
        "the block size (48, 64, 80, 112): the finished turn's last output is processed before its blocks are "
        "freed and caches the block its last computed token fills, so the follow-up hits all of it",
        engine(async_scheduling=True, **pc), with_content(fin, 295))
    # a last verify whose accepted drafts run past max_tokens (found by oracle/fuzz.py): the placeholders of the
    # drafts cut off stay, so the turn caches num_tokens - 1 (P + O - 1 = 31, 47: block 0, 1 and 2 of 16)
    trim = [{"key": "v0", "arrival_step": 0, "parts": [("message", "v0", 25)], "output_tokens": 7},
            {"key": "v1", "arrival_step": 1, "parts": [("system", 0, 40)], "output_tokens": 8},
            {"key": "v2", "arrival_step": 30, "parts": [("message", "v0", 25), ("output", "v0", 7),
                                                        ("message", "v2", 10)], "output_tokens": 3},
            {"key": "v3", "arrival_step": 31, "parts": [("system", 0, 40), ("output", "v1", 8),
                                                        ("message", "v3", 5)], "output_tokens": 3},
            {"key": "v4", "arrival_step": 32, "parts": [("system", 0, 40), ("message", "v4", 20)], "output_tokens": 3}]
    trimmed = with_content(trim, 296, k=3)
    for r, acc in zip(trimmed, ([3, 3, 3], [3, 3, 3], [0, 0, 0], [0, 0, 0], [0, 0, 0])):
        r["accept"] = acc  # turns 0 and 1 end with a verify accepting 3 drafts of which 1 and 0 are emitted
    add("prefix_async_trimmed_verify", "async scheduling, draft model k=3: turns whose last verify accepts more "
        "drafts than their max_tokens leaves room for cache num_tokens - 1 tokens once that output is processed "
        "(vLLM keeps the cut drafts' placeholders), so their follow-ups hit 16 and 32 tokens, not 32 and 48 (and a "
        "request sharing only the 40-token system prompt hits its 32)",
        engine(async_scheduling=True, **pc), trimmed, spec("draft_model", 3))


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for scen in scenarios():
        (OUT / f"{scen['name']}.json").write_text(json.dumps(scen, indent=1) + "\n")
    print(f"wrote {len(scenarios())} scenarios to {OUT}")


if __name__ == "__main__":
    main()
