"""Run the prefix-caching experiments (issue 12, item 6) and draw their figures.

    python experiments/prefix-caching/make_figures.py                 # all three, ~2-3 min on 2 cores
    python experiments/prefix-caching/make_figures.py --only routing  # mooncake | routing | speculation

From the repository root, with the installed servesim (the same Python as this script). Each experiment
runs its ``servesim sweep`` (and, for Mooncake, two ``servesim capacity`` searches) into
``out/prefix-caching/<experiment>/``, prints a markdown table of the numbers README.md here quotes, and
draws its figure into ``experiments/prefix-caching/figures/`` (PNG, with the plotted data beside it as
CSV). A sweep rerun reuses its finished points whose inputs are unchanged. A failing command stops the
script with its exit status and the command; the figure of that experiment is then not (re)written.

* ``mooncake``: ``mooncake-prefix-caching-sweep.yaml`` (p50/p99 TTFT against the trace's rate, prefix
  caching off and on) and the capacity of one H100 with each (p90 TTFT <= 2 s, p99 TPOT <= 50 ms;
  the trace's longest prompts keep p99 TTFT above 2 s at any load without caching);
  figure ``mooncake-ttft.png``.
* ``routing``: ``chat-routing-sweep.yaml`` (multi-turn chat over 4 replicas, round-robin against
  prefix-aware routing): p99 TTFT against the session rate, the highest swept rate within p99 TTFT
  0.5 s and p99 TPOT 50 ms, and the router's prefix match rate (with the engine's prefix-cache hit rate
  when the summary reports one); figure ``chat-routing.png``.
* ``speculation``: ``speculation-prefix-caching-sweep.yaml`` (plain and EAGLE k = 3, each with prefix
  caching off and on): mean TTFT and TPOT against the trace's rate; figure
  ``speculation-prefix-caching.png``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OUT = ROOT / "out" / "prefix-caching"
FIGURES = HERE / "figures"
SERVESIM = [sys.executable, "-c", "import sys; from servesim.cli import main; sys.exit(main())"]
MOONCAKE_SLO = ["--slo", "ttft_p90=2.0", "--slo", "tpot_p99=0.05"]
CHAT_SLO = {"ttft_s.p99": 0.5, "tpot_s.p99": 0.05}


def run(cmd: list[str]) -> str:
    """Run a servesim command from the repository root; its stdout, or exit with its status."""
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shown = " ".join(["servesim", *cmd[3:]])
        sys.stderr.write(done.stderr)
        sys.exit(f"make_figures: failed (exit {done.returncode}): {shown}")
    return done.stdout


def sweep(name: str, out: Path, jobs: int) -> pd.DataFrame:
    """``servesim sweep experiments/prefix-caching/NAME --out OUT``; its summary.csv as a DataFrame."""
    run(SERVESIM + ["sweep", str(HERE / name), "--out", str(out), "--jobs", str(jobs)])
    return pd.read_csv(out / "summary.csv")


def capacity(config: str, sets: list[str], out: Path) -> float | None:
    """``servesim capacity`` of a run config here (one replication); requests/s, or None when the SLOs hold
    at no rate tried."""
    cmd = SERVESIM + ["capacity", str(HERE / config), *MOONCAKE_SLO, "--replications", "1", "--quiet",
                      "--out", str(out)]
    for item in sets:
        cmd += ["--set", item]
    text = run(cmd)
    match = re.search(r"^capacity: ([0-9.eE+-]+) requests/s", text, flags=re.MULTILINE)
    return float(match.group(1)) if match else None


def save(fig, data: pd.DataFrame, stem: str) -> None:
    """Write ``figures/STEM.png`` and the data it plots as ``figures/STEM.csv``."""
    from matplotlib.ticker import ScalarFormatter

    for ax in fig.axes:
        if ax.get_yscale() == "log":
            ax.yaxis.set_major_formatter(ScalarFormatter())
    FIGURES.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(FIGURES / f"{stem}.png", dpi=120)
    data.to_csv(FIGURES / f"{stem}.csv", index=False)


def markdown(frame: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (floats to 4 significant digits)."""
    def text(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(text(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def hit_rate_columns(data: pd.DataFrame) -> list[str]:
    """The engine's prefix-cache hit-rate columns of a sweep table (``prefix_cache.hit_rate``), if any."""
    return [c for c in data.columns if "prefix_cache" in c and c.endswith("hit_rate") and not c.startswith("router.")]


def mooncake(jobs: int, plt) -> None:
    data = sweep("mooncake-prefix-caching-sweep.yaml", OUT / "mooncake", jobs)
    caps = {variant: capacity("mooncake-conv-llama8b-h100.yaml", [f"engine.enable_prefix_caching={on}"],
                              OUT / f"mooncake-capacity-{variant}")
            for variant, on in (("no_prefix_caching", "false"), ("prefix_caching", "true"))}
    table = data[["variant", "rate_scale", "request_throughput", "ttft_s.p50", "ttft_s.p99", "tpot_s.p99",
                  *hit_rate_columns(data)]]
    print("## Mooncake conversation trace, one H100: prefix caching off / on\n")
    print(markdown(table))
    print("\ncapacity (p90 TTFT <= 2 s, p99 TPOT <= 50 ms, requests/s): "
          + ", ".join(f"{k} {v if v is not None else 'none'}" for k, v in caps.items()) + "\n")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for variant, frame in table.groupby("variant", sort=False):
        cap = caps[variant]
        label = f"{variant.replace('_', ' ')} (capacity {cap:.2f} req/s)" if cap else variant.replace("_", " ")
        line, = ax.plot(frame["rate_scale"], frame["ttft_s.p99"], marker="o", label=f"p99, {label}")
        ax.plot(frame["rate_scale"], frame["ttft_s.p50"], marker=".", ls="--", color=line.get_color(),
                label=f"p50, {variant.replace('_', ' ')}")
    ax.set(xlabel="rate scale (x the trace's 3.0 req/s)", ylabel="TTFT (s)", yscale="log")
    ax.set_title("Mooncake conversation trace (1,000 requests), Llama-3.1-8B, 1 x H100", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, table.assign(capacity_req_s=table["variant"].map(caps)), "mooncake-ttft")


def routing(jobs: int, plt) -> None:
    data = sweep("chat-routing-sweep.yaml", OUT / "routing", jobs)
    hit_columns = hit_rate_columns(data)
    columns = ["variant", "sessions_per_s", "request_throughput", "ttft_s.p50", "ttft_s.p99", "tpot_s.p99",
               "router.prefix_match_rate", *hit_columns]
    table = data[[c for c in columns if c in data.columns]]
    ok = (data["completed"] == data["num_requests"])
    for key, bound in CHAT_SLO.items():
        ok &= data[key] <= bound
    best = data[ok].groupby("variant")["sessions_per_s"].max()
    print("## Multi-turn chat over 4 replicas: round-robin / prefix-aware routing\n")
    print(markdown(table))
    print("\nhighest swept session rate within p99 TTFT 0.5 s and p99 TPOT 50 ms (sessions/s): "
          + ", ".join(f"{v} {best.get(v, 'none')}" for v in data["variant"].unique()) + "\n")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for variant, frame in table.groupby("variant", sort=False):
        left.plot(frame["sessions_per_s"], frame["ttft_s.p99"], marker="o",
                  label=f"{variant.replace('_', ' ')} (<= {best.get(variant, 'no')} sessions/s)")
        if variant == "prefix_aware":
            right.plot(frame["sessions_per_s"], frame["router.prefix_match_rate"], marker="o",
                       label="router's estimate (prefix_aware)")
        for col in hit_columns:
            right.plot(frame["sessions_per_s"], frame[col], marker=".", ls="--",
                       label=f"engine {col} ({variant.replace('_', ' ')})")
    left.axhline(CHAT_SLO["ttft_s.p99"], color="grey", ls=":", label="SLO p99 TTFT 0.5 s")
    left.set(xlabel="sessions / s", ylabel="p99 TTFT (s)", yscale="log", title="4 x H100, Llama-3.1-8B, multi-turn chat")
    right.set(xlabel="sessions / s", ylabel="share of prompt blocks", ylim=(0, 1), title="prefix hits")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    save(fig, table.assign(capacity_sessions_per_s=table["variant"].map(best)), "chat-routing")


def speculation(jobs: int, plt) -> None:
    data = sweep("speculation-prefix-caching-sweep.yaml", OUT / "speculation", jobs)
    table = data[["variant", "rate_scale", "request_throughput", "ttft_s.mean", "tpot_s.mean", "e2e_s.mean",
                  *hit_rate_columns(data)]]
    print("## Speculation (EAGLE k = 3) with and without prefix caching, Mooncake, one H100\n")
    print(markdown(table) + "\n")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    for variant, frame in table.groupby("variant", sort=False):
        style = "--" if "prefix_caching" in variant else "-"
        left.plot(frame["rate_scale"], frame["ttft_s.mean"], marker="o", ls=style, label=variant.replace("_", " "))
        right.plot(frame["rate_scale"], 1e3 * frame["tpot_s.mean"], marker="o", ls=style, label=variant.replace("_", " "))
    left.set(xlabel="rate scale", ylabel="mean TTFT (s)", yscale="log", title="TTFT")
    right.set(xlabel="rate scale", ylabel="mean TPOT (ms)", title="TPOT")
    left.legend(fontsize=7)
    fig.suptitle("Mooncake conversation trace, Llama-3.1-8B, 1 x H100: EAGLE k = 3 and prefix caching")
    save(fig, table, "speculation-prefix-caching")


EXPERIMENTS = {"mooncake": mooncake, "routing": routing, "speculation": speculation}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help=f"comma-separated experiments (default: all of {', '.join(EXPERIMENTS)})")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes per sweep (default 2)")
    args = parser.parse_args(argv)
    names = list(EXPERIMENTS) if not args.only else [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        parser.error(f"--only: unknown experiment(s) {', '.join(unknown)} (expected {', '.join(EXPERIMENTS)})")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in names:
        EXPERIMENTS[name](args.jobs, plt)
        plt.close("all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
