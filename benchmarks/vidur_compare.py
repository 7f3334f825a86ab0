#!/usr/bin/env python3
"""Run Vidur and servesim on the same requests and print both simulators' TTFT, TPOT and E2E side by side.

NOT run in CI (it clones and installs Vidur, which needs network access and about 10 minutes).

Workload: ``--num-requests`` (prompt, output) length pairs drawn with replacement from the Azure LLM
inference conversation trace (``workloads/traces/AzureLLMInferenceTrace_conv.csv``), prompt + output clipped
to ``--max-tokens`` the way Vidur does (prompt shortened), Poisson arrivals at ``--qps`` (numpy Generator
seeded with ``--seed``). The SAME request list is written twice: as an Azure-format trace for servesim and as
a Vidur ``trace_replay`` CSV (columns ``Date, Time, PromptTokenCount, CompletionTokenCount``), so the two
simulators see identical arrivals and lengths. No speculative decoding, one replica, TP 1.

Vidur (https://github.com/microsoft/vidur, MLSys'24) is cloned into ``--workdir`` (or ``--vidur-repo``) and
installed into its own virtual environment with ``pip install -r requirements.txt`` and ``pip install -e .``:
Vidur reads its profiling CSVs relative to the repository root (``./data/profiling/...``), so a bare
``pip install vidur`` is not enough; ``--pip-spec`` installs something else instead (e.g. a pinned commit,
``git+https://github.com/microsoft/vidur@<sha>``). Vidur is then run from its repository root as::

    python -m vidur.main --replica_config_device a100 --replica_config_model_name meta-llama/Meta-Llama-3-8B \
      --cluster_config_num_replicas 1 --replica_config_tensor_parallel_size 1 \
      --replica_config_num_pipeline_stages 1 --request_generator_config_type trace_replay \
      --trace_request_generator_config_trace_file FILE --trace_request_generator_config_date 2023-11-16 \
      --trace_request_generator_config_{prefill,decode,time}_scale_factor 1 \
      --trace_request_generator_config_max_tokens 16384 --replica_scheduler_config_type sarathi \
      --sarathi_scheduler_config_batch_size_cap 256 --sarathi_scheduler_config_chunk_size 2048 \
      --random_forrest_execution_time_predictor_config_prediction_max_{prefill_chunk_size,batch_size,tokens_per_request} ...

Flags from Vidur's README (``python -m vidur.main`` example, ``--replica_config_*``, ``--sarathi_scheduler_config_*``,
``--random_forrest_execution_time_predictor_config_*``: the 16K-context settings for Llama-3), its
``vidur/config/config.py`` (``TraceRequestGeneratorConfig``: ``trace_file``, ``date``, ``*_scale_factor``,
``max_tokens``; ``SarathiSchedulerConfig.chunk_size``; ``VllmSchedulerConfig.max_tokens_in_batch``) and
``vidur/request_generator/trace_replay_request_generator.py`` (the CSV columns). Vidur writes
``simulator_output/<timestamp>/request_metrics.csv``; its metrics doc (``docs/metrics.md``) defines
``prefill_e2e_time`` (arrival to first token: TTFT), ``decode_time_execution_plus_preemption_normalized``
(decode time per output token: TPOT) and ``request_e2e_time`` (E2E), all in seconds. Check these against the
Vidur commit you install: flag names have changed between Vidur versions.

Scheduler: vLLM V1 (what servesim models) always chunks prefills within ``max_num_batched_tokens``;
Vidur's ``sarathi`` scheduler (chunked prefill, ``chunk_size`` tokens per step) is the closest, and is the
default here (``--vidur-scheduler vllm`` selects Vidur's vLLM-V0-style scheduler instead). Supported pairs
(Vidur README): Llama-3-8B on A100; Llama-2-7B on A100 or H100.

Wall time and peak memory: each simulator runs as a child process; ``os.wait4`` returns that child's
``resource`` usage (``ru_maxrss``: peak resident set size, KiB on Linux).

Usage::

    python benchmarks/vidur_compare.py --model llama-3-8b --device a100 --qps 6.45 --num-requests 512
    python benchmarks/vidur_compare.py --skip-vidur ...   # servesim side only (no download)
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
AZURE_CONV = REPO / "workloads" / "traces" / "AzureLLMInferenceTrace_conv.csv"
VIDUR_GIT = "https://github.com/microsoft/vidur.git"
TRACE_DATE = "2023-11-16"

#: --model -> (Vidur model name, servesim model card: shipped name or inline mapping, max tokens)
MODELS: dict[str, tuple[str, object, int]] = {
    # Llama-3-8B has the shapes of servesim's Llama-3.1-8B card (same config.json apart from RoPE scaling).
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B", "llama-3.1-8b", 16384),
    "llama-2-7b": ("meta-llama/Llama-2-7b-hf", {
        "name": "Llama-2-7B", "hf_repo": "meta-llama/Llama-2-7b-hf", "num_hidden_layers": 32, "hidden_size": 4096,
        "intermediate_size": 11008, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128,
        "vocab_size": 32000, "tie_word_embeddings": False, "weight_dtype": "fp16", "max_model_len": 4096,
        "source": "meta-llama/Llama-2-7b-hf config.json"}, 4096),
}
#: --device -> (Vidur device, Vidur network device, servesim hardware card)
DEVICES = {"a100": ("a100", "a100_pair_nvlink", "a100-80gb-sxm"), "h100": ("h100", "h100_pair_nvlink", "h100-sxm")}


def make_requests(num: int, qps: float, max_tokens: int, seed: int) -> list[tuple[float, int, int]]:
    """``(arrival_s, prompt_tokens, output_tokens)``: Azure-conv lengths, Poisson arrivals at ``qps`` req/s."""
    prompts, outputs = [], []
    with AZURE_CONV.open(newline="") as fh:
        for row in csv.DictReader(fh):
            prompts.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    idx = rng.integers(0, len(prompts), size=num)
    gaps = rng.exponential(1.0 / qps, size=num)
    arrivals = np.cumsum(gaps) - gaps[0]
    reqs = []
    for t, i in zip(arrivals, idx):
        p, o = max(1, prompts[i]), max(1, outputs[i])
        p = max(1, p - max(0, p + o - max_tokens))  # Vidur's rule: shorten the prompt to fit max_tokens
        o = min(o, max_tokens - p)
        reqs.append((float(t), p, o))
    return reqs


def write_servesim_inputs(reqs, folder: Path, model_card, hardware: str, max_num_seqs: int,
                          max_num_batched_tokens: int, seed: int) -> Path:
    """Azure-format trace + run config for servesim; returns the config path."""
    base = _dt.datetime(2023, 11, 16)
    trace = folder / "requests-azure.csv"
    with trace.open("w", newline="") as fh:
        fh.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for t, p, o in reqs:
            stamp = (base + _dt.timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"  # 7 digits
            fh.write(f"{stamp},{p},{o}\n")
    config = {
        "name": "vidur-compare", "hardware": hardware, "model": model_card, "tensor_parallel_size": 1,
        "engine": {"max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens},
        "workload": {"type": "trace", "path": trace.name}, "seed": seed,
    }
    path = folder / "servesim.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is valid YAML
    return path


def write_vidur_trace(reqs, folder: Path) -> Path:
    path = folder / "requests-vidur.csv"
    with path.open("w", newline="") as fh:
        fh.write("Date,Time,PromptTokenCount,CompletionTokenCount\n")
        for t, p, o in reqs:
            fh.write(f"{TRACE_DATE},{t:.6f},{p},{o}\n")
    return path


def run_measured(cmd: list[str], cwd: Path | None = None, env: dict | None = None) -> dict:
    """Run ``cmd`` as a child; return its exit code, wall time (s) and peak RSS (MiB) from ``os.wait4``."""
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"returncode": proc.returncode, "wall_s": wall, "peak_rss_mib": usage.ru_maxrss / 1024.0}


def setup_vidur(args) -> tuple[Path, Path]:
    """Clone (unless ``--vidur-repo``) and install Vidur in its own venv; returns (repo, venv python)."""
    repo = Path(args.vidur_repo) if args.vidur_repo else args.workdir / "vidur"
    if not repo.exists():
        subprocess.run(["git", "clone", "--depth", "1", VIDUR_GIT, str(repo)], check=True)
    venv = args.workdir / "vidur-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        base_python = args.vidur_python or shutil.which("python3.10") or sys.executable
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--upgrade", "pip"], check=True)
        if args.pip_spec:
            subprocess.run([str(py), "-m", "pip", "install", args.pip_spec], check=True)
        else:
            subprocess.run([str(py), "-m", "pip", "install", "-r", str(repo / "requirements.txt")], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-e", str(repo)], check=True)
    return repo, py


def vidur_command(args, py: Path, trace: Path) -> list[str]:
    vidur_model, _, max_tokens = MODELS[args.model]
    device, network, _ = DEVICES[args.device]
    tr = "--trace_request_generator_config_"
    cmd = [
        str(py), "-m", "vidur.main",
        "--seed", str(args.seed),
        "--replica_config_device", device, "--replica_config_network_device", network,
        "--replica_config_model_name", vidur_model,
        "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--request_generator_config_type", "trace_replay",
        tr + "trace_file", str(trace.resolve()), tr + "date", TRACE_DATE,
        tr + "prefill_scale_factor", "1", tr + "decode_scale_factor", "1", tr + "time_scale_factor", "1",
        tr + "max_tokens", str(max_tokens),
        "--replica_scheduler_config_type", args.vidur_scheduler,
    ]
    if args.vidur_scheduler == "sarathi":
        cmd += ["--sarathi_scheduler_config_batch_size_cap", str(args.max_num_seqs),
                "--sarathi_scheduler_config_chunk_size", str(args.max_num_batched_tokens)]
    else:
        cmd += ["--vllm_scheduler_config_batch_size_cap", str(args.max_num_seqs),
                "--vllm_scheduler_config_max_tokens_in_batch", str(max(args.max_num_batched_tokens, max_tokens))]
    if max_tokens > 4096:  # Vidur README: needed for Llama-3's 16K context
        rf = "--random_forrest_execution_time_predictor_config_prediction_"
        cmd += [rf + "max_prefill_chunk_size", str(max_tokens), rf + "max_batch_size", str(max(512, args.max_num_seqs)),
                rf + "max_tokens_per_request", str(max_tokens)]
    return cmd + list(args.vidur_extra)


def percentiles(values, qs=(50, 90, 99)) -> list[float]:
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    return [float(np.percentile(v, q)) if v.size else float("nan") for q in qs]


def read_columns(path: Path, columns: dict[str, str]) -> dict[str, list[float]]:
    """``{our name: values}`` of the given CSV columns (empty cells -> NaN)."""
    out: dict[str, list[float]] = {k: [] for k in columns}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            for ours, theirs in columns.items():
                cell = row.get(theirs, "")
                out[ours].append(float(cell) if cell not in ("", None) else float("nan"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="llama-3-8b")
    p.add_argument("--device", choices=sorted(DEVICES), default="a100")
    p.add_argument("--qps", type=float, default=6.45, help="Poisson arrival rate (requests/s; Vidur README: 6.45)")
    p.add_argument("--num-requests", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=256, help="servesim max_num_seqs = Vidur batch_size_cap")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="servesim token budget = Vidur sarathi chunk_size (vLLM's A100 default 2048)")
    p.add_argument("--vidur-scheduler", choices=["sarathi", "vllm"], default="sarathi")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, default=REPO / ".vidur-compare", help="clone, venv and outputs")
    p.add_argument("--vidur-repo", default=None, help="an existing Vidur checkout (skips the clone)")
    p.add_argument("--vidur-python", default=None, help="interpreter for Vidur's venv (default python3.10)")
    p.add_argument("--pip-spec", default=None, help="install this instead of the checkout's requirements")
    p.add_argument("--skip-vidur", action="store_true", help="run only the servesim side")
    p.add_argument("--vidur-extra", nargs=argparse.REMAINDER, default=[], help="extra flags passed to vidur.main")
    args = p.parse_args(argv)
    if args.model == "llama-3-8b" and args.device == "h100" and not args.skip_vidur:
        print("warning: Vidur's README lists no H100 profile for Llama-3-8B; expect Vidur to fail", file=sys.stderr)
    args.workdir = args.workdir.resolve()
    run_dir = args.workdir / f"run-{args.model}-{args.device}-qps{args.qps:g}-n{args.num_requests}-s{args.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)

    _, card, max_tokens = MODELS[args.model]
    reqs = make_requests(args.num_requests, args.qps, max_tokens, args.seed)
    cfg = write_servesim_inputs(reqs, run_dir, card, DEVICES[args.device][2], args.max_num_seqs,
                                args.max_num_batched_tokens, args.seed)
    out_s = run_dir / "servesim-out"
    rs = run_measured([sys.executable, "-m", "servesim.cli", "run", str(cfg), "--out", str(out_s), "--no-plot",
                       "--quiet"], cwd=REPO)
    results = {}
    if rs["returncode"] == 0:
        results["servesim"] = (read_columns(out_s / "requests.csv", {"ttft": "ttft_s", "tpot": "tpot_s",
                                                                     "e2e": "e2e_s"}), rs)
    else:
        print(f"servesim failed (exit {rs['returncode']})", file=sys.stderr)

    if not args.skip_vidur:
        repo, py = setup_vidur(args)
        trace = write_vidur_trace(reqs, run_dir)
        before = set((repo / "simulator_output").glob("*")) if (repo / "simulator_output").exists() else set()
        env = {**os.environ, "WANDB_MODE": "disabled"}
        rv = run_measured(vidur_command(args, py, trace), cwd=repo, env=env)
        new = sorted(set((repo / "simulator_output").glob("*")) - before, key=lambda d: d.stat().st_mtime)
        if rv["returncode"] == 0 and new and (new[-1] / "request_metrics.csv").exists():
            shutil.copytree(new[-1], run_dir / "vidur-out", dirs_exist_ok=True)
            results["vidur"] = (read_columns(new[-1] / "request_metrics.csv", {
                "ttft": "prefill_e2e_time", "tpot": "decode_time_execution_plus_preemption_normalized",
                "e2e": "request_e2e_time"}), rv)
        else:
            print(f"Vidur failed or wrote no request_metrics.csv (exit {rv['returncode']})", file=sys.stderr)

    names = list(results)
    print(f"\n{args.model} on {args.device}, {args.num_requests} requests, Poisson {args.qps:g} req/s, "
          f"Azure conversation lengths (seed {args.seed})")
    print(f"{'metric (s)':<16}" + "".join(f"{n + ' p50/p90/p99':>36}" for n in names))
    summary: dict = {"setup": vars(args) | {"workdir": str(args.workdir)}, "results": {}}
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")):
        cells = []
        for n in names:
            ps = percentiles(results[n][0][key])
            summary["results"].setdefault(n, {})[key] = dict(zip(("p50", "p90", "p99"), ps))
            cells.append(f"{ps[0]:>11.4f} {ps[1]:>11.4f} {ps[2]:>11.4f}")
        print(f"{label:<16}" + "".join(f"{c:>36}" for c in cells))
    print(f"{'wall time (s)':<16}" + "".join(f"{results[n][1]['wall_s']:>36.2f}" for n in names))
    print(f"{'peak RSS (MiB)':<16}" + "".join(f"{results[n][1]['peak_rss_mib']:>36.1f}" for n in names))
    for n in names:
        summary["results"][n]["wall_s"] = results[n][1]["wall_s"]
        summary["results"][n]["peak_rss_mib"] = results[n][1]["peak_rss_mib"]
    summary["setup"]["vidur_extra"] = list(args.vidur_extra)
    (run_dir / "compare.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"wrote {run_dir / 'compare.json'}")
    return 0 if names and (args.skip_vidur or "vidur" in results) else 1


if __name__ == "__main__":
    sys.exit(main())
