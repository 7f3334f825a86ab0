"""Run vLLM 0.32's own v1 scheduler on scenario files and write its per-step trace (the golden traces).

This script is the oracle for servesim's scheduler. It is NOT part of servesim and servesim never imports
it: it needs vLLM, installed by ``oracle/install.sh`` into its own virtual environment (CPU build, no GPU,
no model weights). Usage::

    oracle/.venv/bin/python oracle/vllm_oracle.py oracle/scenarios/*.json --out tests/data/golden

Each scenario (JSON, see ``oracle/README.md``) gives the engine settings, the KV pool size in blocks
(vLLM's ``num_gpu_blocks``, null block included), the speculative config, and the requests: the step at
which each arrives, its prompt and output lengths, and for speculation the drafts it would accept in each
verification round (``accept``: ``A_j``, the accepted drafts of round ``j`` when ``k`` or more were
drafted; ``-1`` = the n-gram proposer finds no match and drafts nothing in that round).

The scheduler is vLLM's real ``Scheduler`` (``AsyncScheduler`` with ``async_scheduling``) built from
configs alone: a tiny local model config (``oracle/models/``), one full-attention KV group with the
scenario's number of blocks, prefix caching as the scenario says (``engine.enable_prefix_caching``; then the
request tokens come from the scenario's ``segments``, see ``content_token``). The model is faked: every
request whose scheduled tokens reach its known tokens samples ``1 + min(drafts scheduled, A_j)`` tokens;
the drafter proposes ``k`` drafts (vLLM's ``num_spec_tokens_to_schedule`` of the step) for every request
that sampled, or none in an n-gram round with ``A_j = -1``. Requests end by ``max_tokens`` with
``ignore_eos``. The engine loop is vLLM's ``EngineCore.step`` (sync) or ``step_with_batch_queue`` with two
batches in flight (async).

Trace (one entry per ``schedule()`` call that scheduled tokens): ``scheduled`` = ``[request, tokens,
drafts]`` in vLLM's order (running requests in running order, then admissions), ``preempted`` = victims in
order (with those of a call just before that scheduled nothing), ``kv_blocks_used`` = blocks held after scheduling (null block excluded), ``num_waiting`` = waiting
requests before scheduling, ``k`` = ``num_spec_tokens_to_schedule`` (the drafts proposed after this step).
With prefix caching also ``new_computed`` = ``[request, num_computed_tokens]`` of the requests taken from
WAITING (the prefix-cache hit, tokens) and ``prefix_cache`` = the step's ``PrefixCacheStats``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
VLLM_VERSION = "0.32.0"

# prefix caching: vLLM's default block hash (sha256 over pickled tokens, NONE_HASH from a fixed seed unless
# PYTHONHASHSEED is set; hits depend only on which hashes are equal, so the traces do not depend on the seed)
HASH_ALGO = "sha256"
VOCAB_SIZE = 1024  # the tiny models' vocab_size (oracle/models/*/config.json)
MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser (Vigna's splitmix64.c), as ``servesim.workload.content.mix64``."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def content_token(content: int, offset: int) -> int:
    """Token at ``offset`` of content ``content`` (a servesim content id): in ``[1, VOCAB_SIZE)``."""
    return mix64(mix64(content) + offset) % (VOCAB_SIZE - 1) + 1


def sequence_token(segments: list, position: int) -> int:
    """Token at ``position`` of a request's sequence given as ``[[content id, tokens], ...]``.

    Positions past the last segment continue its content (a speculative step may sample past the end).
    """
    for content, tokens in segments:
        if position < tokens:
            return content_token(content, position)
        position -= tokens
    content, tokens = segments[-1]
    return content_token(content, tokens + position)


# draft model folders per method (MTP uses the target's own config, with 1 or more MTP layers)
DRAFT_MODELS = {"eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "draft_model": "draft"}


def _vllm():
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch  # noqa: F401
    import vllm
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    if not vllm.__version__.startswith(VLLM_VERSION):
        raise SystemExit(f"vllm_oracle: expected vLLM {VLLM_VERSION}, found {vllm.__version__}")
    return locals()


def build_scheduler(v, scen: dict):
    """vLLM's scheduler for a scenario, with the built configs checked against what was asked for."""
    import torch

    eng = scen["engine"]
    spec = scen.get("speculative_config")
    max_len = int(eng.get("max_model_len", 8192))
    target = "llama"
    if spec is not None and spec["method"] == "mtp":
        target = "mtp3" if spec.get("num_nextn_predict_layers", 1) > 1 else "mtp1"
    mc = v["ModelConfig"](model=str(MODELS / target), skip_tokenizer_init=True, max_model_len=max_len, dtype="bfloat16")
    sc = v["SchedulerConfig"](
        max_model_len=max_len,
        is_encoder_decoder=False,
        max_num_seqs=eng["max_num_seqs"],
        max_num_batched_tokens=eng["max_num_batched_tokens"],
        enable_chunked_prefill=eng.get("enable_chunked_prefill", True),
        async_scheduling=bool(eng.get("async_scheduling", False)),
    )
    bs = int(eng.get("block_size", 16))
    prefix = bool(eng.get("enable_prefix_caching", False))
    cc = v["CacheConfig"](block_size=bs, enable_prefix_caching=prefix, prefix_caching_hash_algo=HASH_ALGO)
    cc.num_gpu_blocks = int(eng["num_gpu_blocks"])
    sp = None
    if spec is not None:
        kw = dict(method=spec["method"], num_speculative_tokens=spec["num_speculative_tokens"],
                  target_model_config=mc, target_parallel_config=v["ParallelConfig"]())
        if spec["method"] in DRAFT_MODELS:
            kw["model"] = str(MODELS / DRAFT_MODELS[spec["method"]])
        if spec.get("num_speculative_tokens_per_batch_size") is not None:
            kw["num_speculative_tokens_per_batch_size"] = [tuple(e) for e in spec["num_speculative_tokens_per_batch_size"]]
        sp = v["SpeculativeConfig"](**kw)
    vc = v["VllmConfig"](model_config=mc, scheduler_config=sc, cache_config=cc, speculative_config=sp)
    # the CPU platform rewrites some settings (async scheduling off; for MLA models such as the MTP target,
    # chunked prefill off and an 8192-token budget): insist on what the scenario asked for
    vc.scheduler_config.async_scheduling = bool(eng.get("async_scheduling", False))
    vc.scheduler_config.enable_chunked_prefill = eng.get("enable_chunked_prefill", True)
    vc.scheduler_config.max_num_batched_tokens = eng["max_num_batched_tokens"]
    if vc.scheduler_config.max_num_scheduled_tokens is not None:
        vc.scheduler_config.max_num_scheduled_tokens = eng["max_num_batched_tokens"]
    vc.cache_config.block_size = bs
    vc.cache_config.enable_prefix_caching = prefix  # the CPU platform turns it off for MLA targets (MTP)
    got = (vc.scheduler_config.max_num_seqs, vc.scheduler_config.max_num_batched_tokens,
           vc.scheduler_config.enable_chunked_prefill, vc.cache_config.block_size, vc.cache_config.enable_prefix_caching)
    want = (eng["max_num_seqs"], eng["max_num_batched_tokens"], eng.get("enable_chunked_prefill", True), bs, prefix)
    if got != want:
        raise SystemExit(f"vllm_oracle: {scen['name']}: vLLM built {got}, scenario asked for {want}")
    if sp is not None and vc.num_speculative_tokens != spec["num_speculative_tokens"]:
        raise SystemExit(f"vllm_oracle: {scen['name']}: vLLM built num_speculative_tokens={vc.num_speculative_tokens}")
    kv = v["KVCacheConfig"](
        num_blocks=int(eng["num_gpu_blocks"]),
        kv_cache_tensors=[],
        kv_cache_groups=[v["KVCacheGroupSpec"](["layer.0"], v["FullAttentionSpec"](
            block_size=bs, num_kv_heads=2, head_size=16, dtype=torch.bfloat16))],
    )
    base = v["AsyncScheduler"] if eng.get("async_scheduling", False) else v["Scheduler"]

    class Tracing(base):
        """vLLM's scheduler, recording preemption victims in order."""

        victims: list

        def _preempt_request(self, request, *args, **kwargs):
            self.victims.append(int(request.request_id))
            return super()._preempt_request(request, *args, **kwargs)

    # log_stats only with prefix caching: the per-step PrefixCacheStats (the other traces stay as they were)
    s = Tracing(vllm_config=vc, kv_cache_config=kv, structured_output_manager=v["StructuredOutputManager"](vc),
                block_size=bs, log_stats=prefix)
    s.victims = []
    info = {
        "num_lookahead_tokens": vc.num_lookahead_tokens,
        "num_prefill_lookahead_tokens": vc.num_prefill_lookahead_tokens,
        "max_num_new_slots_for_drafting": sp.max_num_new_slots_for_drafting if sp is not None else 0,
        "max_num_scheduled_tokens": s.max_num_scheduled_tokens,
        "async_scheduling": bool(vc.scheduler_config.async_scheduling),
    }
    if prefix:
        info["enable_prefix_caching"] = True
        info["prefix_caching_hash_algo"] = vc.cache_config.prefix_caching_hash_algo
        info["use_eagle_block_drop"] = bool(s.kv_cache_manager.use_eagle)
        # multi-module MTP: the last (num_prefill_lookahead - 1) computed tokens are not cached yet
        info["num_reprefillable_tokens"] = int(s.kv_cache_manager.coordinator.num_reprefillable_tokens)
    return s, info


class Driver:
    """Fake model runner and drafter for one scenario (see the module docstring)."""

    def __init__(self, v, scen: dict, sched) -> None:
        self.v, self.scen, self.s = v, scen, sched
        spec = scen.get("speculative_config")
        self.ngram = spec is not None and spec["method"] == "ngram"
        self.spec = spec is not None
        self.reqs = scen["requests"]
        self.rounds = [0] * len(self.reqs)  # verification rounds done
        self.sampled_since_admit = [False] * len(self.reqs)
        self.steps: list[dict] = []
        self.prefix = bool(scen["engine"].get("enable_prefix_caching", False))
        self.block_hasher = None
        if self.prefix:
            hash_fn = v["get_hash_fn_by_name"](HASH_ALGO)
            v["init_none_hash"](hash_fn)
            self.block_hasher = v["get_request_block_hasher"](int(scen["engine"].get("block_size", 16)), hash_fn)

    def prompt_ids(self, pos: int) -> list[int]:
        r = self.reqs[pos]
        if not self.prefix:
            return [3 + (pos * 7 + i) % 1000 for i in range(r["prompt_tokens"])]
        return [sequence_token(r["segments"], i) for i in range(r["prompt_tokens"])]

    def next_tokens(self, rid: str, count: int) -> list[int]:
        """The next ``count`` tokens of a request's sequence after what vLLM holds now (prefix caching)."""
        req = self.s.requests[rid]
        segments = self.reqs[int(rid)]["segments"]
        return [sequence_token(segments, req.num_tokens + i) for i in range(count)]

    def fill_samples(self, out) -> None:
        """Give the sampled tokens their values just before vLLM appends them (prefix caching only).

        The fake runner decides at scheduling time how many tokens a request samples; which tokens they are
        is decided here, from the request's sequence at the position vLLM appends them (its ``num_tokens``
        when the output is processed: in async scheduling that is after the next step was scheduled).
        """
        if not self.prefix:
            return
        for i, rid in enumerate(out.req_ids):
            tokens = out.sampled_token_ids[i]
            if tokens and rid in self.s.requests:
                tokens[:] = self.next_tokens(rid, len(tokens))

    def add_arrivals(self, step: int, pos: int) -> int:
        v = self.v
        while pos < len(self.reqs) and self.reqs[pos]["arrival_step"] <= step:
            r = self.reqs[pos]
            self.s.add_request(v["Request"](
                str(pos), self.prompt_ids(pos),
                v["SamplingParams"](max_tokens=r["output_tokens"], ignore_eos=True), None, arrival_time=float(step),
                block_hasher=self.block_hasher))
            pos += 1
        return pos

    def schedule(self, step: int):
        s = self.s
        nwait = len(s.waiting)
        status = self.v["RequestStatus"]
        from_waiting = {rid for rid, req in s.requests.items() if req.status in (status.WAITING, status.PREEMPTED)}
        so = s.schedule()
        stats = s.kv_cache_manager.make_prefix_cache_stats() if self.prefix else None
        if so.total_num_scheduled_tokens == 0:
            if stats is not None and (stats.requests or stats.preempted_requests):
                raise SystemExit(f"vllm_oracle: {self.scen['name']}: prefix-cache lookups in an empty step {step}")
            return so, None
        usable = s.kv_cache_manager.block_pool.num_gpu_blocks - 1
        used = usable - s.kv_cache_manager.block_pool.get_num_free_blocks()
        sched, sampled = [], []
        victims = list(s.victims)
        for v in victims:
            self.sampled_since_admit[v] = False
        for rid, n in so.num_scheduled_tokens.items():
            r = int(rid)
            d = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            req = s.requests[rid]
            samples = not req.is_prefill_chunk
            tokens = []
            if samples:
                acc = 0
                if self.sampled_since_admit[r]:  # a verification round (it sampled in its previous step)
                    accept = self.reqs[r].get("accept", [])
                    a = accept[self.rounds[r]] if self.rounds[r] < len(accept) else 0
                    acc = max(0, min(d, a))
                    self.rounds[r] += 1
                tokens = [5] * (1 + acc)
                self.sampled_since_admit[r] = True
            sched.append([r, n, d])
            sampled.append(tokens)
        entry = {"step": step, "scheduled": sched, "preempted": victims, "kv_blocks_used": used,
                 "num_waiting": nwait, "k": int(so.num_spec_tokens_to_schedule)}
        if self.prefix:
            entry["new_computed"] = self.new_computed(so, from_waiting)
            entry["prefix_cache"] = {
                "requests": stats.requests, "queries": stats.queries, "hits": stats.hits,
                "preempted_requests": stats.preempted_requests, "preempted_queries": stats.preempted_queries,
                "preempted_hits": stats.preempted_hits,
            }
        self.steps.append(entry)
        s.victims = []  # (a call that scheduled nothing keeps its victims for the next entry)
        ids = list(so.num_scheduled_tokens)
        out = self.v["ModelRunnerOutput"](req_ids=ids, req_id_to_index={x: i for i, x in enumerate(ids)},
                                           sampled_token_ids=sampled)
        return so, out

    def new_computed(self, so, from_waiting: set) -> list[list[int]]:
        """``[request, num_computed_tokens at scheduling]`` of the requests this step took from WAITING.

        ``num_computed_tokens`` before this step's tokens = the prefix-cache hit (in tokens); it is checked
        against what the scheduler output itself says for new requests.
        """
        s = self.s
        out = []
        told = {d.req_id: d.num_computed_tokens for d in so.scheduled_new_reqs}
        for rid, n in so.num_scheduled_tokens.items():
            if rid not in from_waiting:
                continue
            hit = s.requests[rid].num_computed_tokens - n
            if rid in told and told[rid] != hit:
                raise SystemExit(f"vllm_oracle: {self.scen['name']}: request {rid}: hit {hit} != {told[rid]}")
            out.append([int(rid), int(hit)])
        return out

    def drafts(self, so) -> None:
        """The drafter's proposals after a (sync) step: k drafts for each request that sampled."""
        if not self.spec:
            return
        k = int(so.num_spec_tokens_to_schedule)
        ids, drafts = [], []
        for rid in so.num_scheduled_tokens:
            req = self.s.requests.get(rid)
            if req is None or req.is_finished() or req.is_prefill_chunk:
                continue
            r = int(rid)
            n = k
            if self.ngram:
                acc = self.reqs[r]["accept"]
                if self.rounds[r] < len(acc) and acc[self.rounds[r]] < 0:
                    n = 0
            ids.append(rid)
            drafts.append(self.next_tokens(rid, n) if self.prefix else [9] * n)
        self.s.update_draft_token_ids(self.v["DraftTokenIds"](ids, drafts))

    def next_arrival(self, pos: int):
        return self.reqs[pos]["arrival_step"] if pos < len(self.reqs) else None

    def run_sync(self, max_steps: int) -> None:
        s, step, pos = self.s, 0, 0
        while True:
            pos = self.add_arrivals(step, pos)
            if s.get_num_unfinished_requests() == 0:
                nxt = self.next_arrival(pos)
                if nxt is None:
                    return
                step = max(step, nxt)
                continue
            so, out = self.schedule(step)
            if out is None:
                raise SystemExit(f"vllm_oracle: {self.scen['name']}: nothing schedulable at step {step}")
            self.fill_samples(out)
            s.update_from_output(so, out)
            self.drafts(so)
            step += 1
            if step > max_steps:
                raise SystemExit(f"vllm_oracle: {self.scen['name']}: more than {max_steps} steps")

    def run_async(self, max_steps: int) -> None:
        """``EngineCore.step_with_batch_queue`` with a batch queue of 2 (async scheduling)."""
        s, step, pos = self.s, 0, 0
        queue: deque = deque()
        while True:
            pos = self.add_arrivals(step, pos)
            if s.get_num_unfinished_requests() == 0 and not queue:
                nxt = self.next_arrival(pos)
                if nxt is None:
                    return
                step = max(step, nxt)
                continue
            executed = False
            if s.has_requests():
                so, out = self.schedule(step)
                executed = out is not None
                if out is None:
                    ids = []
                    out = self.v["ModelRunnerOutput"](req_ids=ids, req_id_to_index={}, sampled_token_ids=[])
                queue.appendleft((so, out))
                if executed:
                    step += 1
                if len(queue) < 2 and (executed or s.has_requests()):
                    continue
            elif not queue:
                continue
            so, out = queue.pop()
            self.fill_samples(out)
            s.update_from_output(so, out)
            if step > max_steps:
                raise SystemExit(f"vllm_oracle: {self.scen['name']}: more than {max_steps} steps")


def run_scenario(v, scen: dict) -> dict:
    sched, info = build_scheduler(v, scen)
    drv = Driver(v, scen, sched)
    max_steps = 20 * sum(r["prompt_tokens"] + r["output_tokens"] for r in scen["requests"]) + 100
    if info["async_scheduling"]:
        drv.run_async(max_steps)
    else:
        drv.run_sync(max_steps)
    return {"vllm_version": VLLM_VERSION, "vllm_config": info, "scenario": scen, "steps": drv.steps}


def write_trace(golden: dict, target: Path) -> None:
    """Write a trace as gzip'd compact JSON with a zero timestamp (byte-identical for the same trace)."""
    tmp = target.with_suffix(".tmp")
    with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
        fh.write(json.dumps(golden, separators=(",", ":")).encode())
    tmp.replace(target)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenarios", nargs="+", type=Path, help="scenario JSON files")
    ap.add_argument("--out", type=Path, required=True, help="folder for the golden traces (NAME.json.gz)")
    args = ap.parse_args(argv)
    v = _vllm()
    args.out.mkdir(parents=True, exist_ok=True)
    for path in args.scenarios:
        scen = json.loads(path.read_text())
        golden = run_scenario(v, scen)
        target = args.out / f"{scen['name']}.json.gz"
        write_trace(golden, target)
        print(f"{scen['name']}: {len(golden['steps'])} steps -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
