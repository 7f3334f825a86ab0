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
scenario's number of blocks, prefix caching off (servesim does not model it). The model is faked: every
request whose scheduled tokens reach its known tokens samples ``1 + min(drafts scheduled, A_j)`` tokens;
the drafter proposes ``k`` drafts (vLLM's ``num_spec_tokens_to_schedule`` of the step) for every request
that sampled, or none in an n-gram round with ``A_j = -1``. Requests end by ``max_tokens`` with
``ignore_eos``. The engine loop is vLLM's ``EngineCore.step`` (sync) or ``step_with_batch_queue`` with two
batches in flight (async).

Trace (one entry per ``schedule()`` call that scheduled tokens): ``scheduled`` = ``[request, tokens,
drafts]`` in vLLM's order (running requests in running order, then admissions), ``preempted`` = victims in
order, ``kv_blocks_used`` = blocks held after scheduling (null block excluded), ``num_waiting`` = waiting
requests before scheduling, ``k`` = ``num_spec_tokens_to_schedule`` (the drafts proposed after this step).
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

# draft model folders per method (MTP uses the target's own config, with 1 or more MTP layers)
DRAFT_MODELS = {"eagle": "eagle", "eagle3": "eagle3", "medusa": "medusa", "draft_model": "draft"}


def _vllm():
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import torch  # noqa: F401
    import vllm
    from vllm.config import CacheConfig, ModelConfig, ParallelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request
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
    cc = v["CacheConfig"](block_size=bs, enable_prefix_caching=False)
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
    got = (vc.scheduler_config.max_num_seqs, vc.scheduler_config.max_num_batched_tokens,
           vc.scheduler_config.enable_chunked_prefill, vc.cache_config.block_size, vc.cache_config.enable_prefix_caching)
    want = (eng["max_num_seqs"], eng["max_num_batched_tokens"], eng.get("enable_chunked_prefill", True), bs, False)
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

    s = Tracing(vllm_config=vc, kv_cache_config=kv, structured_output_manager=v["StructuredOutputManager"](vc),
                block_size=bs)
    s.victims = []
    info = {
        "num_lookahead_tokens": vc.num_lookahead_tokens,
        "num_prefill_lookahead_tokens": vc.num_prefill_lookahead_tokens,
        "max_num_new_slots_for_drafting": sp.max_num_new_slots_for_drafting if sp is not None else 0,
        "max_num_scheduled_tokens": s.max_num_scheduled_tokens,
        "async_scheduling": bool(vc.scheduler_config.async_scheduling),
    }
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

    def add_arrivals(self, step: int, pos: int) -> int:
        v = self.v
        while pos < len(self.reqs) and self.reqs[pos]["arrival_step"] <= step:
            r = self.reqs[pos]
            self.s.add_request(v["Request"](
                str(pos), [3 + (pos * 7 + i) % 1000 for i in range(r["prompt_tokens"])],
                v["SamplingParams"](max_tokens=r["output_tokens"], ignore_eos=True), None, arrival_time=float(step)))
            pos += 1
        return pos

    def schedule(self, step: int):
        s = self.s
        nwait = len(s.waiting)
        s.victims = []
        so = s.schedule()
        if so.total_num_scheduled_tokens == 0:
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
        self.steps.append({"step": step, "scheduled": sched, "preempted": victims, "kv_blocks_used": used,
                           "num_waiting": nwait, "k": int(so.num_spec_tokens_to_schedule)})
        ids = list(so.num_scheduled_tokens)
        out = self.v["ModelRunnerOutput"](req_ids=ids, req_id_to_index={x: i for i, x in enumerate(ids)},
                                           sampled_token_ids=sampled)
        return so, out

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
            drafts.append([9] * n)
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
        tmp = target.with_suffix(".tmp")
        with gzip.GzipFile(tmp, "wb", mtime=0) as fh:
            fh.write(json.dumps(golden, separators=(",", ":")).encode())
        tmp.replace(target)
        print(f"{scen['name']}: {len(golden['steps'])} steps -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
