"""Seeded random differential check of servesim's scheduler against vLLM 0.32's, step by step.

Draws random scenarios (the oracle's scenario format, ``oracle/README.md``) from a numpy Generator seeded by
``--seed`` (the same seed and count give the same scenarios; scenario ``i`` comes from child ``i`` of
``SeedSequence(seed)``, so it does not depend on the count), has vLLM's own scheduler trace each one
(``vllm_oracle.run_scenario`` in a worker process of the oracle's venv, see ``oracle/install.sh``), replays
every trace in servesim in step mode and in run mode (``tests/golden_replay.py``, as
``tests/test_golden_vllm.py`` does) and prints one line per disagreement, then the totals. Run it in
servesim's venv::

    python oracle/fuzz.py --seed 1 -n 200                 # 200 scenarios from seed 1
    python oracle/fuzz.py --seed 1 -n 200 --keep out/fuzz # also keep the scenarios and vLLM's traces
    python oracle/fuzz.py --seed 1 --only 17 --minimise   # shrink scenario 17 while it still disagrees

Scenarios vLLM refuses (its config checks, or a scenario the oracle cannot drive) are counted apart, with
vLLM's reason; so are scenarios servesim refuses. ``--minimise`` drops requests and shortens outputs while
the disagreement remains and prints the smallest scenario as JSON (ready for ``make_scenarios.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ORACLE_PYTHON = HERE / ".venv" / "bin" / "python"

METHODS = ("eagle", "eagle3", "medusa", "draft_model", "mtp", "ngram")
# methods whose drafts need KV lookahead slots (vLLM's num_lookahead_tokens = k); n-gram and Medusa need none
LOOKAHEAD_METHODS = ("eagle", "eagle3", "draft_model", "mtp")
# vLLM refuses async scheduling with the CPU n-gram proposer and Medusa ("only supported with EAGLE/MTP/Draft
# Model/NGram GPU/...")
ASYNC_METHODS = ("eagle", "eagle3", "draft_model", "mtp")
NAMESPACE_SHIFT = 56  # servesim's content ids (servesim/workload/content.py): namespace << 56 | index
NAMESPACE_SYSTEM_PROMPT, NAMESPACE_MESSAGE, NAMESPACE_OUTPUT = 2, 3, 4


# ---------------------------------------------------------------------------------------- drawing scenarios
def draw_spec(rng: np.random.Generator) -> dict | None:
    """A speculative config (or None, plain decoding, 40%): method, k in 1..5 (3 for MTP with 3 layers), a k
    table 25% of the time."""
    if rng.random() < 0.4:
        return None
    method = str(rng.choice(METHODS))
    k = int(rng.integers(1, 6))
    out: dict = {"method": method, "num_speculative_tokens": k}
    if method == "mtp":
        layers = int(rng.choice([1, 3]))
        out["num_nextn_predict_layers"] = layers
        if layers == 3:  # vLLM: num_speculative_tokens must be divisible by the MTP layers
            out["num_speculative_tokens"] = k = 3
    if rng.random() < 0.25:
        out["num_speculative_tokens_per_batch_size"] = draw_k_table(rng, k)
    return out


def draw_k_table(rng: np.random.Generator, k: int) -> list[list[int]]:
    """``num_speculative_tokens_per_batch_size``: 1-3 inclusive batch-size ranges from 1, k in 0..K each."""
    bounds = np.sort(rng.choice(np.arange(1, 12), size=int(rng.integers(0, 3)), replace=False))
    starts = [1] + [int(b) + 1 for b in bounds]
    ends = [int(b) for b in bounds] + [64]
    return [[s, e, int(rng.integers(0, k + 1))] for s, e in zip(starts, ends)]


def draw_engine(rng: np.random.Generator) -> dict:
    """Engine settings without the pool size (drawn once the requests are known, :func:`pool_blocks`)."""
    seqs = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16]))
    tokens = int(rng.choice([8, 16, 24, 32, 48, 64, 96, 128, 256, 512]))
    return {"max_num_seqs": seqs, "max_num_batched_tokens": max(tokens, seqs),
            "num_gpu_blocks": 0, "block_size": int(rng.choice([16, 16, 32])),
            "enable_chunked_prefill": bool(rng.random() < 0.8), "async_scheduling": bool(rng.random() < 0.3),
            "max_model_len": 8192}


def arrival_steps(rng: np.random.Generator, n: int) -> np.ndarray:
    """Sorted arrival steps of ``n`` requests, the first at 0: spread, bursts, all at once, or clusters."""
    kind = rng.choice(["spread", "burst", "zero", "clusters"])
    if kind == "spread":
        steps = np.sort(rng.integers(0, 4 * n + 1, n))
    elif kind == "burst":
        steps = np.where(np.arange(n) < n // 2, 0, int(rng.integers(5, 60)))
    elif kind == "zero":
        steps = np.zeros(n, dtype=np.int64)
    else:
        steps = np.sort(rng.choice(rng.integers(0, 80, 3), n))
    return steps - steps[0]


def accept_rounds(rng: np.random.Generator, rounds: int, k: int, ngram: bool) -> list[int]:
    """``A_j`` per verification round: accepted drafts of ``k`` at a per-position acceptance drawn in
    0.3..0.95; for n-gram ``-1`` (no match) in up to 40% of rounds."""
    alpha = rng.uniform(0.3, 0.95)
    acc = np.cumprod(rng.random((rounds, k)) < alpha, axis=1).sum(axis=1)
    if ngram:
        acc[rng.random(rounds) < rng.uniform(0.0, 0.4)] = -1
    return [int(a) for a in acc]


def draw_lengths(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompt (2..~300 tokens, log-uniform) and output (1..~100 tokens) lengths of ``n`` requests."""
    prompts = np.exp(rng.uniform(np.log(2), np.log(rng.choice([40, 120, 300])), n)).astype(np.int64)
    outputs = np.exp(rng.uniform(0, np.log(rng.choice([4, 30, 100])), n)).astype(np.int64)
    return np.maximum(prompts, 2), np.maximum(outputs, 1)


def plain_requests(rng: np.random.Generator, n: int) -> list[dict]:
    """``n`` requests without content (prefix caching off)."""
    prompts, outputs = draw_lengths(rng, n)
    steps = arrival_steps(rng, n)
    return [{"arrival_step": int(steps[i]), "prompt_tokens": int(prompts[i]), "output_tokens": int(outputs[i])}
            for i in range(n)]


def content_id(namespace: int, index: int) -> int:
    return namespace << NAMESPACE_SHIFT | index


def prefix_requests(rng: np.random.Generator, n: int) -> list[dict]:
    """``n`` requests with ``segments``: shared system prompts (1-3, 1..200 tokens), each request's own
    message, repeated messages, and follow-up turns that resend an earlier request's prompt and output."""
    systems = [int(x) for x in rng.integers(1, 201, int(rng.integers(1, 4)))]
    prompts, outputs = draw_lengths(rng, n)
    steps = arrival_steps(rng, n)
    out: list[dict] = []
    for i in range(n):
        step = int(steps[i])
        kind = rng.choice(["fresh", "follow_up", "same_prompt"], p=[0.6, 0.3, 0.1]) if out else "fresh"
        if kind == "follow_up":  # resends an earlier request's prompt and output, arriving after it
            j = int(rng.integers(0, len(out)))
            parts = [list(s) for s in out[j]["segments"]]
            step = max(step, out[j]["arrival_step"] + int(rng.integers(0, 3 * out[j]["output_tokens"] + 40)))
        elif kind == "same_prompt":
            parts = [list(s) for s in out[int(rng.integers(0, len(out)))]["segments"][:-1]]
        else:  # a system prompt (70%) and its own message
            parts = [[content_id(NAMESPACE_SYSTEM_PROMPT, int(s)), systems[s]]
                     for s in rng.choice(len(systems), int(rng.random() < 0.7))]
        if kind != "same_prompt":
            parts.append([content_id(NAMESPACE_MESSAGE, i), int(prompts[i])])
        parts.append([content_id(NAMESPACE_OUTPUT, i), int(outputs[i])])
        prompt = sum(t for _, t in parts[:-1])
        out.append({"arrival_step": step, "prompt_tokens": prompt, "output_tokens": int(outputs[i]),
                    "segments": parts})
    return out


def lookahead(spec: dict | None) -> int:
    """KV lookahead slots of a speculative config (tokens)."""
    return spec["num_speculative_tokens"] if spec is not None and spec["method"] in LOOKAHEAD_METHODS else 0


def pool_blocks(rng: np.random.Generator, eng: dict, spec: dict | None, reqs: list[dict]) -> int:
    """``num_gpu_blocks`` (null block included): tight (the longest request plus its lookahead, plus 1-12
    blocks: preemptions) half the time, else room for about a quarter to all of the requests at once."""
    bs = eng["block_size"]
    need = [-(-(r["prompt_tokens"] + r["output_tokens"] + lookahead(spec) + 1) // bs) for r in reqs]
    least = max(need) + 2
    if rng.random() < 0.5:
        return least + int(rng.integers(0, 12))
    return max(least, int(sum(need) * rng.uniform(0.25, 1.2)))


def draw_scenario(rng: np.random.Generator, name: str) -> dict:
    """One random scenario (see the module docstring)."""
    eng = draw_engine(rng)
    spec = draw_spec(rng)
    if spec is not None and spec["method"] not in ASYNC_METHODS:
        eng["async_scheduling"] = False
    if rng.random() < 0.35:
        eng["enable_prefix_caching"] = True
    n = int(rng.integers(2, 31))
    reqs = prefix_requests(rng, n) if eng.get("enable_prefix_caching") else plain_requests(rng, n)
    reqs.sort(key=lambda r: r["arrival_step"])  # stable: request ids in arrival order
    longest = max(r["prompt_tokens"] + r["output_tokens"] for r in reqs)
    if not eng["enable_chunked_prefill"]:
        # vLLM requires max_model_len <= max_num_batched_tokens without chunked prefill
        eng["max_num_batched_tokens"] = max(eng["max_num_batched_tokens"], longest)
        eng["max_model_len"] = eng["max_num_batched_tokens"]
    elif rng.random() < 0.3:
        eng["max_model_len"] = longest + int(rng.integers(0, 4))  # drafts near the context's end
    if spec is not None:
        for r in reqs:
            r["accept"] = accept_rounds(rng, r["output_tokens"], spec["num_speculative_tokens"],
                                        spec["method"] == "ngram")
    eng["num_gpu_blocks"] = pool_blocks(rng, eng, spec, reqs)
    return {"name": name, "description": "random (oracle/fuzz.py)", "engine": eng, "speculative_config": spec,
            "requests": reqs}


def scenarios(seed: int, n: int) -> list[dict]:
    """``n`` scenarios from ``seed``: scenario ``i`` from child ``i`` of ``SeedSequence(seed)``."""
    children = np.random.SeedSequence(seed).spawn(n)
    return [draw_scenario(np.random.default_rng(c), f"fuzz_s{seed}_{i}") for i, c in enumerate(children)]


# ---------------------------------------------------------------------------------------- vLLM's side
def serve() -> int:
    """The vLLM worker (run in the oracle's venv): one scenario per stdin line, one answer per stdout line,
    ``{"trace": ...}`` or ``{"rejected": reason}``. vLLM's own prints go to stderr."""
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.path.insert(0, str(HERE))
    import vllm_oracle

    v = vllm_oracle._vllm()
    for line in sys.stdin:
        scen = json.loads(line)
        try:
            answer = {"trace": vllm_oracle.run_scenario(v, scen)}
        except (Exception, SystemExit) as exc:  # vLLM's config checks, or the oracle's own refusals
            answer = {"rejected": " ".join(f"{type(exc).__name__}: {exc}".split())[:400]}
        answers.write(json.dumps(answer, separators=(",", ":")) + "\n")
        answers.flush()
    return 0


class Oracle:
    """A vLLM worker process (:func:`serve` in the oracle's venv), started once: vLLM's import takes 10-20 s."""

    def __init__(self) -> None:
        env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
        self.proc = subprocess.Popen([str(ORACLE_PYTHON), str(Path(__file__).resolve()), "--serve"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     stderr=subprocess.DEVNULL)

    def trace(self, scen: dict) -> dict:
        """vLLM's answer for one scenario: ``{"trace": golden}`` or ``{"rejected": reason}``."""
        self.proc.stdin.write(json.dumps(scen) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("fuzz: the vLLM worker died (run oracle/install.sh?)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


# ---------------------------------------------------------------------------------------- servesim's side
def disagreement(golden: dict) -> str | None:
    """The first difference between servesim's replay (step mode, then run mode) and vLLM's trace, in one
    line (``mode: step #i (vLLM step s): field servesim X vLLM Y, ...``), or None when both modes agree.
    A scenario servesim refuses answers ``refused: ...``; a difference at a step showing a vLLM behaviour
    servesim documents as out of scope (oracle/README.md) answers ``known: ...``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from golden_replay import replay

    want = golden["steps"]
    for mode in ("step", "run"):
        try:
            got = replay(golden, mode)
        except ValueError as exc:
            return f"refused: {str(exc).splitlines()[0]}"
        except Exception as exc:  # an engine failure is a disagreement too
            return f"{mode}: servesim raised {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        i = first_differing_step(got, want)
        if i is not None:
            known = known_limitation(golden["scenario"], got[i] if i < len(got) else None,
                                     want[i] if i < len(want) else None)
            return f"known: {known}" if known else f"{mode}: {describe(got, want, i)}"
    return None


def first_differing_step(got: list[dict], want: list[dict]) -> int | None:
    """Index of the first step where the traces differ (the shorter one's length if one is a prefix)."""
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def describe(got: list[dict], want: list[dict], i: int) -> str:
    """Step ``i``'s difference in one line: its index, vLLM's step number, the fields that differ."""
    if i >= len(got) or i >= len(want):
        return f"servesim ran {len(got)} steps, vLLM {len(want)}"
    g, w = got[i], want[i]
    fields = ", ".join(f"{key} servesim {g.get(key)} vLLM {w.get(key)}" for key in w if g.get(key) != w[key])
    return f"step #{i} (vLLM step {w['step']}): {fields}"


def known_limitation(scen: dict, got: dict | None, want: dict | None) -> str | None:
    """The documented vLLM behaviour a differing step shows, or None: vLLM's padding of a 1-token remainder
    to ``1 + K`` tokens (static K; README, 'Known vLLM behaviours the scenarios leave out'), seen as a request
    taken from WAITING that vLLM schedules with drafts, or a new request with one prompt token left after
    its prefix-cache hit that servesim schedules (vLLM pads it, or leaves it waiting when ``1 + K`` tokens do
    not fit the budget)."""
    spec = scen.get("speculative_config")
    if spec is None or spec.get("num_speculative_tokens_per_batch_size"):
        return None
    if want is not None:
        taken = {r for r, _ in want.get("new_computed", [])}
        for r, tokens, drafts in want["scheduled"]:
            if r in taken and drafts > 0:
                return (f"vLLM step {want['step']}: request {r} taken from WAITING with one token left after its "
                        f"prefix-cache hit is padded to {tokens} tokens (1-token remainder with a static K)")
    if got is not None:
        for r, hit in got.get("new_computed", []):
            if scen["requests"][r]["prompt_tokens"] - hit == 1:
                return (f"step {got['step']}: request {r} has one prompt token left after its prefix-cache hit of "
                        f"{hit} (1-token remainder with a static K: vLLM pads it to 1 + K tokens)")
    return None


# ---------------------------------------------------------------------------------------- minimising
def shrink_candidates(scen: dict):
    """Smaller variants of a scenario: one request fewer, then one request's output (and its segment) halved
    or its prompt halved (without content), then all arrivals pulled earlier."""
    reqs = scen["requests"]
    for i in range(len(reqs)):
        if len(reqs) > 1:
            yield with_requests(scen, reqs[:i] + reqs[i + 1:])
    for i, r in enumerate(reqs):
        if r["output_tokens"] > 1:
            yield with_requests(scen, reqs[:i] + [with_output(r, r["output_tokens"] // 2)] + reqs[i + 1:])
        if "segments" not in r and r["prompt_tokens"] > 2:
            yield with_requests(scen, reqs[:i] + [dict(r, prompt_tokens=max(2, r["prompt_tokens"] // 2))] + reqs[i + 1:])
    first = min(r["arrival_step"] for r in reqs)
    if any(r["arrival_step"] > first for r in reqs):
        yield with_requests(scen, [dict(r, arrival_step=(r["arrival_step"] + first) // 2) for r in reqs])


def with_requests(scen: dict, reqs: list[dict]) -> dict:
    return dict(scen, requests=sorted(reqs, key=lambda r: r["arrival_step"]))


def with_output(r: dict, outputs: int) -> dict:
    """Request ``r`` with ``outputs`` output tokens (its accept rounds and its own output segment cut)."""
    out = dict(r, output_tokens=outputs)
    if "accept" in r:
        out["accept"] = r["accept"][:outputs]
    if "segments" in r:
        out["segments"] = r["segments"][:-1] + [[r["segments"][-1][0], outputs]]
    return out


def minimise(oracle: Oracle, scen: dict) -> tuple[dict, str]:
    """Shrink ``scen`` greedily while vLLM accepts it and servesim still disagrees (not a refusal)."""
    best, why = scen, disagreement(oracle.trace(scen)["trace"])
    improved = True
    while improved:
        improved = False
        for cand in shrink_candidates(best):
            answer = oracle.trace(cand)
            if "trace" not in answer:
                continue
            line = disagreement(answer["trace"])
            if line is not None and not line.startswith(("refused", "known")):
                best, why, improved = cand, line, True
                break
    return best, why


# ---------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="the Generator's seed (default 0)")
    ap.add_argument("-n", type=int, default=100, help="scenarios to draw (default 100)")
    ap.add_argument("--only", type=int, nargs="*", help="check only these scenario indices of the seed")
    ap.add_argument("--minimise", action="store_true", help="shrink each disagreeing scenario, print it as JSON")
    ap.add_argument("--keep", type=Path, help="folder for the scenarios (NAME.json) and vLLM's traces (NAME.json.gz)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the vLLM worker (internal)
    args = ap.parse_args(argv)
    if args.serve:
        return serve()
    count = max(args.n, max(args.only) + 1) if args.only else args.n
    scens = scenarios(args.seed, count)
    if args.only:
        scens = [scens[i] for i in args.only]
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    oracle = Oracle()
    counts = {"agree": 0, "disagree": 0, "known": 0, "vllm_rejects": 0, "servesim_refuses": 0}
    try:
        for scen in scens:
            check(oracle, scen, args, counts)
    finally:
        oracle.close()
    print(f"total: {len(scens)} scenarios (seed {args.seed}): " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 1 if counts["disagree"] else 0


def check(oracle: Oracle, scen: dict, args, counts: dict) -> None:
    """Trace one scenario in vLLM, replay it, print a line unless both modes agree, count the outcome."""
    answer = oracle.trace(scen)
    if args.keep:
        (args.keep / f"{scen['name']}.json").write_text(json.dumps(scen, indent=1) + "\n")
    if "trace" not in answer:
        counts["vllm_rejects"] += 1
        print(f"{scen['name']}: vLLM rejects it: {answer['rejected']}", flush=True)
        return
    if args.keep:
        sys.path.insert(0, str(HERE))
        from vllm_oracle import write_trace

        write_trace(answer["trace"], args.keep / f"{scen['name']}.json.gz")
    line = disagreement(answer["trace"])
    if line is None:
        counts["agree"] += 1
        return
    if line.startswith(("refused", "known")):
        counts["servesim_refuses" if line.startswith("refused") else "known"] += 1
        print(f"{scen['name']}: servesim {line}", flush=True)
        return
    counts["disagree"] += 1
    print(f"{scen['name']}: {line}", flush=True)
    if args.minimise:
        small, why = minimise(oracle, scen)
        print(f"{scen['name']}: minimised to {len(small['requests'])} requests: {why}\n{json.dumps(small)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
