#!/usr/bin/env python3
"""Measure forward-pass step times of a Llama-shaped model on your own NVIDIA GPU, for ``servesim calibrate``.

No model download: the script builds a RANDOMLY initialised decoder with the shapes of a servesim model card
(RMSNorm, grouped-query attention over a KV-cache tensor, rotary embeddings, SwiGLU MLP, BF16), then times
one forward pass (an engine step) over a grid of

* decode steps: ``B`` requests, each with ``C`` tokens of KV cache, one new token each (``T = B``);
* prefill chunks: one request, ``T`` new tokens after ``C`` cached tokens;

and writes ``--out`` (CSV: ``batch_size, context_tokens, scheduled_tokens, step_time_s`` plus ``kind``,
``repeats``, ``cuda_graph``, ``p10_s``, ``p90_s``) and ``<out>.env.json`` (GPU, torch and CUDA versions,
model shape, command line). Then::

    servesim calibrate --hardware h100-sxm --model llama-3.1-8b --data steps.csv --out my-h100.yaml

Timing: CUDA events around each forward, ``--warmup`` untimed runs, the MEDIAN of ``--repeats``. Decode
steps are captured in a CUDA graph (as vLLM does for decode batches) unless ``--no-cuda-graph``; prefill
chunks run eagerly. Logits are computed for the last position of each request only (as vLLM does). The
forward pass only: no sampler, scheduler or detokenizer, so the fitted ``step_overhead_s`` is GPU-side
overhead; a vLLM server adds its CPU-side per-step overhead unless it overlaps it. Weights are random,
which does not change the time of dense matmuls and attention. Grid points whose KV cache does not fit in
free GPU memory are skipped. ``--max-seconds`` (default 420) stops the grid early so that a run fits in
8 minutes; the grid is ordered so that an early stop keeps both decode and prefill points.

Requires PyTorch (>= 2.1) and a CUDA GPU; ``--device cpu --tiny`` runs a 2-layer toy model on the CPU as a
smoke test. servesim is optional: when it is importable, ``--model`` accepts any servesim model card (name,
YAML or Hugging Face config.json); otherwise one of the built-in shapes.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

CSV_FIELDS = ("batch_size", "context_tokens", "scheduled_tokens", "step_time_s", "kind", "repeats", "cuda_graph",
              "p10_s", "p90_s")


@dataclass(frozen=True)
class ModelShape:
    """Dense Llama-style decoder shape (counts; ``head_dim`` in elements)."""

    name: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """K and V of one token over all layers (bytes)."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim * bytes_per_element


#: Shapes used when servesim is not importable (from each model's Hugging Face config.json).
BUILTIN_SHAPES: dict[str, ModelShape] = {
    "llama-3.1-8b": ModelShape("Llama-3.1-8B", 32, 4096, 14336, 32, 8, 128, 128256),
    "llama-3.2-1b": ModelShape("Llama-3.2-1B", 16, 2048, 8192, 32, 8, 64, 128256),
    "llama-3.1-70b": ModelShape("Llama-3.1-70B", 80, 8192, 28672, 64, 8, 128, 128256),
    "qwen3-8b": ModelShape("Qwen3-8B", 36, 4096, 12288, 32, 8, 128, 151936),
}
TINY_SHAPE = ModelShape("tiny-2-layer", 2, 64, 128, 4, 2, 16, 256)


def resolve_shape(spec: str, tiny: bool = False) -> ModelShape:
    """The shape to build: ``TINY_SHAPE`` with ``tiny``; a servesim card if servesim is importable; a builtin.

    Raises:
        SystemExit: unknown model, or a card that is not a dense GQA decoder (MoE, MLA, explicit cards).
    """
    if tiny:
        return TINY_SHAPE
    try:
        from servesim.cards import load_model
        from servesim.errors import ServesimError
    except ImportError:
        load_model = None  # type: ignore[assignment]
    if load_model is not None:
        try:
            card = load_model(spec, source="--model")
        except ServesimError as exc:
            if spec.lower() in BUILTIN_SHAPES:
                return BUILTIN_SHAPES[spec.lower()]
            raise SystemExit(f"measure_step_times: {exc}") from None
        if card.is_explicit or card.is_moe or getattr(card, "kv_lora_rank", None):
            raise SystemExit(f"measure_step_times: --model {spec}: only dense decoders with (grouped-query) "
                             "attention are built by this script (no MoE, MLA or explicit-totals cards)")
        return ModelShape(card.name, card.num_hidden_layers, card.hidden_size, card.intermediate_size,
                          card.num_attention_heads, card.num_key_value_heads or card.num_attention_heads,
                          card.resolved_head_dim, card.vocab_size)
    if spec.lower() in BUILTIN_SHAPES:
        return BUILTIN_SHAPES[spec.lower()]
    raise SystemExit(f"measure_step_times: --model {spec!r}: servesim is not importable and this is not a "
                     f"built-in shape (one of {', '.join(BUILTIN_SHAPES)})")


def parse_int_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (argparse type; values must be >= 0)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers (got {text!r})") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 0 (got {text!r})")
    return values


def build_grid(batch_sizes: list[int], contexts: list[int], prefill_tokens: list[int],
               prefill_contexts: list[int]) -> list[tuple[str, int, int, int]]:
    """Grid points ``(kind, batch_size, context_tokens, scheduled_tokens)``, decode and prefill interleaved.

    Each list is ordered by cost (small first) and the two are interleaved, so that stopping early for the
    time budget keeps cheap points of both kinds.
    """
    decode = sorted({("decode", b, c, b) for b in batch_sizes if b >= 1 for c in contexts},
                    key=lambda p: (p[1] * (p[2] + 1), p[1], p[2]))
    prefill = sorted({("prefill", 1, c, t) for t in prefill_tokens if t >= 1 for c in prefill_contexts},
                     key=lambda p: (p[3] * (p[2] + p[3]), p[3], p[2]))
    out: list[tuple[str, int, int, int]] = []
    for i in range(max(len(decode), len(prefill))):
        if i < len(decode):
            out.append(decode[i])
        if i < len(prefill):
            out.append(prefill[i])
    return out


def estimate_bytes(shape: ModelShape, batch: int, context: int, tokens: int, elem: int = 2) -> int:
    """Rough memory (bytes) of one grid point beyond the weights: KV cache, activations, mask, logits."""
    q = math.ceil(tokens / batch)
    kv = shape.kv_bytes_per_token(elem) * batch * (context + q)
    width = max(2 * shape.intermediate_size, (shape.num_attention_heads + 2 * shape.num_key_value_heads)
                * shape.head_dim, shape.hidden_size)
    act = 6 * tokens * width * elem
    groups = shape.num_attention_heads // shape.num_key_value_heads
    mask = groups * q * (context + q) if q > 1 else 0
    scores = batch * shape.num_attention_heads * q * (context + q) * 4 if q > 1 else 0  # math-backend worst case
    return kv + act + mask + scores + batch * shape.vocab_size * 4


def write_row(path: Path, row: dict[str, Any], header: bool) -> None:
    """Append one CSV row (with the header first when ``header``) and flush it to disk."""
    with path.open("a" if not header else "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        if header:
            w.writeheader()
        w.writerow(row)


# ------------------------------------------------------------------------------------------ torch model
class TinyLlama:
    """Functional Llama-style decoder with random weights (torch imported by the caller)."""

    def __init__(self, torch: Any, shape: ModelShape, device: str, dtype: Any, seed: int) -> None:
        self.torch, self.shape, self.device, self.dtype = torch, shape, device, dtype
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        s = shape

        def w(*size: int) -> Any:
            return torch.empty(*size, device=device, dtype=dtype).normal_(0.0, 0.02, generator=gen)

        qkv = (s.num_attention_heads + 2 * s.num_key_value_heads) * s.head_dim
        self.embed = w(s.vocab_size, s.hidden_size)
        self.layers = [
            dict(
                norm1=torch.ones(s.hidden_size, device=device, dtype=dtype),
                wqkv=w(s.hidden_size, qkv),
                wo=w(s.num_attention_heads * s.head_dim, s.hidden_size),
                norm2=torch.ones(s.hidden_size, device=device, dtype=dtype),
                wgu=w(s.hidden_size, 2 * s.intermediate_size),
                wdown=w(s.intermediate_size, s.hidden_size),
            )
            for _ in range(s.num_hidden_layers)
        ]
        self.norm = torch.ones(s.hidden_size, device=device, dtype=dtype)
        self.lm_head = w(s.hidden_size, s.vocab_size)

    def _rmsnorm(self, x: Any, weight: Any) -> Any:
        t = self.torch
        xf = x.float()
        return (xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * weight

    def prepare(self, batch: int, context: int, tokens: int) -> Callable[[], Any]:
        """Allocate inputs and a KV cache for one grid point; return the step function (no allocation of
        new persistent state inside, so it can be captured in a CUDA graph)."""
        t, s = self.torch, self.shape
        q = tokens // batch  # the grid only makes T = B (decode) or B = 1 (prefill)
        total = context + q
        groups = s.num_attention_heads // s.num_key_value_heads
        ids = t.randint(0, s.vocab_size, (batch, q), device=self.device)
        caches = [(t.zeros(batch, s.num_key_value_heads, total, s.head_dim, device=self.device, dtype=self.dtype),
                   t.zeros(batch, s.num_key_value_heads, total, s.head_dim, device=self.device, dtype=self.dtype))
                  for _ in range(s.num_hidden_layers)]
        pos = t.arange(context, total, device=self.device, dtype=t.float32)
        inv = 1.0 / (500000.0 ** (t.arange(0, s.head_dim, 2, device=self.device, dtype=t.float32) / s.head_dim))
        ang = t.outer(pos, inv)
        cos = t.cat([ang.cos(), ang.cos()], -1).to(self.dtype)
        sin = t.cat([ang.sin(), ang.sin()], -1).to(self.dtype)
        mask = None
        if q > 1:  # causal after `context` cached tokens, tiled over the query heads of each KV head
            rows = t.arange(q, device=self.device)[:, None] + context
            cols = t.arange(total, device=self.device)[None, :]
            mask = (cols <= rows).repeat(groups, 1)  # (groups * q, total)
        sdpa = t.nn.functional.scaled_dot_product_attention

        def rope(x: Any) -> Any:
            half = x.shape[-1] // 2
            rot = t.cat([-x[..., half:], x[..., :half]], -1)
            return x * cos + rot * sin

        def step() -> Any:
            h = self.embed[ids]  # (B, q, D)
            for layer, (kc, vc) in zip(self.layers, caches):
                r = h
                x = self._rmsnorm(h, layer["norm1"]) @ layer["wqkv"]
                qh, kh, vh = x.split([s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim,
                                      s.num_key_value_heads * s.head_dim], dim=-1)
                qh = rope(qh.view(batch, q, s.num_attention_heads, s.head_dim).transpose(1, 2))
                kh = rope(kh.view(batch, q, s.num_key_value_heads, s.head_dim).transpose(1, 2))
                kc[:, :, context:total] = kh
                vc[:, :, context:total] = vh.view(batch, q, s.num_key_value_heads, s.head_dim).transpose(1, 2)
                # Grouped-query attention without copying K/V: fold the query heads of a KV head into rows.
                qg = qh.reshape(batch, s.num_key_value_heads, groups * q, s.head_dim)
                o = sdpa(qg, kc, vc, attn_mask=mask)
                o = o.view(batch, s.num_attention_heads, q, s.head_dim).transpose(1, 2).reshape(batch, q, -1)
                h = r + o @ layer["wo"]
                r = h
                g, u = (self._rmsnorm(h, layer["norm2"]) @ layer["wgu"]).chunk(2, dim=-1)
                h = r + (t.nn.functional.silu(g) * u) @ layer["wdown"]
            return self._rmsnorm(h[:, -1], self.norm) @ self.lm_head  # logits of the last position (B, V)

        return step


def _time(torch: Any, fn: Callable[[], Any], device: str, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in events]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def _graphed(torch: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="servesim model card (name/path) or built-in shape")
    p.add_argument("--batch-sizes", type=parse_int_list, default=[1, 2, 4, 8, 16, 32, 64, 128, 256],
                   help="decode batch sizes (default 1,2,4,...,256)")
    p.add_argument("--contexts", type=parse_int_list, default=[256, 2048, 8192],
                   help="KV tokens per request for decode steps (default 256,2048,8192)")
    p.add_argument("--prefill-tokens", type=parse_int_list, default=[128, 512, 1024, 2048, 4096, 8192],
                   help="tokens of single-request prefill chunks (default 128,...,8192; empty to skip)")
    p.add_argument("--prefill-contexts", type=parse_int_list, default=[0, 2048],
                   help="cached tokens before a prefill chunk (default 0,2048)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per point; the median is written")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs per point (default 3)")
    p.add_argument("--max-seconds", type=float, default=420.0,
                   help="stop the grid after this many seconds (default 420, fits an 8-minute slot)")
    p.add_argument("--out", type=Path, default=Path("step-times.csv"), help="CSV to write")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (with --tiny, a smoke test)")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                   help="weights and activations (default bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--tiny", action="store_true", help="2-layer toy model (smoke test)")
    p.add_argument("--no-cuda-graph", action="store_true", help="run decode steps eagerly")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and token ids")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        p.error("--repeats must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; returns the exit status (1 when torch or CUDA is missing)."""
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("measure_step_times: PyTorch is not installed. Install it on the machine with the GPU "
              "(https://pytorch.org/get-started/locally/, e.g. `pip install torch`) and run again.", file=sys.stderr)
        return 1
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("measure_step_times: CUDA is not available to PyTorch (no NVIDIA GPU or driver, or a CPU-only "
              "torch build). Run it on a GPU machine, or try `--device cpu --tiny` as a smoke test.", file=sys.stderr)
        return 1
    dtype_name = args.dtype or ("bf16" if device.startswith("cuda") else "fp32")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    elem = 4 if dtype_name == "fp32" else 2
    shape = resolve_shape(args.model, args.tiny)
    grid = build_grid(args.batch_sizes, args.contexts, args.prefill_tokens, args.prefill_contexts)
    t_start = time.monotonic()
    torch.manual_seed(args.seed)
    model = TinyLlama(torch, shape, device, dtype, args.seed)
    use_graph = device.startswith("cuda") and not args.no_cuda_graph
    print(f"{shape.name}: {shape.num_hidden_layers} layers, hidden {shape.hidden_size}, {dtype_name} on "
          f"{device}; {len(grid)} grid points, budget {args.max_seconds:.0f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header, measured, skipped, stopped = True, 0, [], False
    with torch.inference_mode():
        for kind, b, c, t in grid:
            if time.monotonic() - t_start > args.max_seconds:
                stopped = True
                print(f"time budget of {args.max_seconds:.0f} s reached; stopping the grid")
                break
            if device.startswith("cuda"):
                free, _total = torch.cuda.mem_get_info()
                if estimate_bytes(shape, b, c, t, elem) > 0.85 * free:
                    skipped.append(f"{kind} B={b} C={c} T={t}: needs more than free memory")
                    continue
            graphed = False
            try:
                fn = model.prepare(b, c, t)
                if use_graph and kind == "decode":
                    try:
                        fn, graphed = _graphed(torch, fn), True
                    except Exception as exc:  # noqa: BLE001 - fall back to eager on any capture failure
                        print(f"  CUDA graph capture failed ({type(exc).__name__}); timing eagerly")
                times = _time(torch, fn, device, args.warmup, args.repeats)
            except RuntimeError as exc:  # includes torch.cuda.OutOfMemoryError
                skipped.append(f"{kind} B={b} C={c} T={t}: {type(exc).__name__}")
                del exc
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
                continue
            med = statistics.median(times)
            write_row(args.out, dict(batch_size=b, context_tokens=c, scheduled_tokens=t, step_time_s=f"{med:.6e}",
                                     kind=kind, repeats=len(times), cuda_graph=int(graphed),
                                     p10_s=f"{_quantile(times, 0.1):.6e}", p90_s=f"{_quantile(times, 0.9):.6e}"),
                      header)
            header = False
            measured += 1
            print(f"  {kind:7s} B={b:<4d} C={c:<6d} T={t:<5d} {med * 1e3:9.3f} ms")
            del fn
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "device": device,
        "gpu_name": torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor(),
        "gpu_capability": list(torch.cuda.get_device_capability(device)) if device.startswith("cuda") else None,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "python_version": platform.python_version(),
        "dtype": dtype_name,
        "model_shape": asdict(shape),
        "points_measured": measured,
        "points_skipped": skipped,
        "stopped_by_time_budget": stopped,
        "wall_seconds": round(time.monotonic() - t_start, 1),
        "note": "forward pass only (random weights; no sampler/scheduler); decode steps CUDA-graphed unless "
                "--no-cuda-graph",
    }
    env_path = args.out.with_suffix(".env.json")
    env_path.write_text(json.dumps(env, indent=2) + "\n", encoding="utf-8")
    if measured == 0:
        print("measure_step_times: no grid point could be measured", file=sys.stderr)
        return 1
    print(f"wrote {args.out} ({measured} steps) and {env_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
