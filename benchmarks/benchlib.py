"""What the benchmark scripts share: timing a child ``servesim`` process and the same-run references.

Absolute times on a shared machine drift by +-30% from one minute to the next, so every benchmark also
measures two references in the same run and reports each figure divided by each of them:

* ``import numpy``: the wall time of a fresh ``python -c "import numpy"`` process (interpreter start-up
  plus numpy's import: disk, page cache and process creation, like a short ``servesim run``);
* ``loop``: a fixed pure-Python loop (:data:`LOOP_ITERATIONS` additions, in this process: the CPU's
  speed for interpreted code, like the simulation's inner loops).

Each reference is the median of :data:`REFERENCE_REPEATS` timings, taken before and after every group of
runs; a figure's ratio uses the median of all reference timings around it.

Not a test and not imported by servesim: the benchmark scripts in this folder import it
(``python benchmarks/NAME.py`` puts this folder on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Additions in the pure-Python reference loop.
LOOP_ITERATIONS = 3_000_000
#: Timings of each reference per measurement (their median is kept).
REFERENCE_REPEATS = 3
#: vLLM's --speculative-config of the EAGLE runs (k = 3, the Llama-3.1-8B ShareGPT acceptance profile).
EAGLE = '{"method": "eagle", "num_speculative_tokens": 3, "acceptance": "eagle-llama3.1-8b-sharegpt-k3"}'


def servesim_command(config: Path, out: str, overrides: list[str], spec: bool) -> list[str]:
    """The ``servesim run CONFIG --out OUT --no-plot --quiet [--set ...] [--speculative-config EAGLE]`` argv."""
    cmd = [sys.executable, "-c", "from servesim.cli import console_main; console_main()",
           "run", str(config), "--out", out, "--no-plot", "--quiet"]
    for text in overrides:
        cmd += ["--set", text]
    if spec:
        cmd += ["--speculative-config", EAGLE]
    return cmd


def run_child(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` as a child process; return (wall seconds, peak resident memory in MB = 10^6 bytes).

    Raises:
        SystemExit: the child failed (its status in the message).
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(cmd[3:6])}: failed with status {code}")
    return wall, usage.ru_maxrss * 1024 / 1e6  # ru_maxrss is in KiB on Linux


def loop_s() -> float:
    """Seconds of the fixed pure-Python loop (:data:`LOOP_ITERATIONS` additions) in this process."""
    t0 = time.perf_counter()
    total = 0
    for i in range(LOOP_ITERATIONS):
        total += i
    return time.perf_counter() - t0


def import_numpy_s() -> float:
    """Wall seconds of a fresh ``python -c "import numpy"`` process."""
    return run_child([sys.executable, "-c", "import numpy"])[0]


@dataclass
class References:
    """The same-run reference timings (seconds), appended by :meth:`measure` before and after each group."""

    import_numpy_s: list[float] = field(default_factory=list)
    loop_s: list[float] = field(default_factory=list)

    def measure(self) -> None:
        """Time each reference :data:`REFERENCE_REPEATS` times and keep each one's median."""
        self.import_numpy_s.append(statistics.median(import_numpy_s() for _ in range(REFERENCE_REPEATS)))
        self.loop_s.append(statistics.median(loop_s() for _ in range(REFERENCE_REPEATS)))

    def around(self, start: int) -> tuple[float, float]:
        """Median (import numpy s, loop s) of the measurements from index ``start`` on (those around a group)."""
        return statistics.median(self.import_numpy_s[start:]), statistics.median(self.loop_s[start:])

    def as_json(self) -> dict:
        return {"import_numpy_s": self.import_numpy_s, "loop_s": self.loop_s, "loop_iterations": LOOP_ITERATIONS,
                "repeats_per_measurement": REFERENCE_REPEATS}


def ratios(seconds: float, refs: tuple[float, float]) -> dict[str, float]:
    """``seconds`` divided by each reference: ``{"per_import_numpy": ..., "per_loop": ...}``."""
    return {"per_import_numpy": seconds / refs[0], "per_loop": seconds / refs[1]}


def machine() -> dict:
    """The machine and its load when the benchmark ran (CPUs, 1-minute load average, UTC time, CPU model),
    whether servesim's bytecode is cached (:func:`bytecode_cached`) and whether idle file cache is paged out
    (:func:`file_cache_pageout`)."""
    return {"cpus": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
            "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": sys.version.split()[0],
            "bytecode_cached": bytecode_cached(), "PYTHONDONTWRITEBYTECODE": bool(os.environ.get("PYTHONDONTWRITEBYTECODE")),
            "compiled_engine": compiled_engine(), "cpu_model": cpu_model(), "file_cache_pageout": file_cache_pageout()}


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), or None where it cannot be read: sessions' machines differ."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def file_cache_pageout() -> bool:
    """Whether the kernel pages out memory left idle, file cache included (a running DAMON scheme with the
    ``pageout`` action, as on some of this project's VMs: idle for a few seconds, servesim's and numpy's
    module files are read from disk again by the next run, which then takes longer than one right after
    another)."""
    root = Path("/sys/kernel/mm/damon/admin/kdamonds")
    try:
        for kdamond in root.glob("*"):
            if (kdamond / "state").read_text().strip() != "on":
                continue
            if any(action.read_text().strip() == "pageout" for action in kdamond.glob("contexts/*/schemes/*/action")):
                return True
    except OSError:
        pass
    return False


def compiled_engine() -> str:
    """Whether the engine runs compiled (setup.py's optional Cython build; servesim.compiled) in a child
    run: ``"compiled"``, ``"interpreted"`` ($SERVESIM_PURE_PYTHON set, or a pure-Python install) or
    ``"partly compiled"`` (sources edited since the build)."""
    code = "from servesim.compiled import compiled_modules as c; m = c(); print(sum(m.values()), len(m))"
    done, total = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                          check=True).stdout.split())
    return "compiled" if total and done == total else "partly compiled" if done else "interpreted"


def bytecode_cached() -> bool:
    """Whether every module of the ``servesim`` package has an up-to-date cached bytecode file.

    Without one (an editable install run with ``PYTHONDONTWRITEBYTECODE=1``, as on this project's machines,
    never writes them), every ``servesim run`` compiles its ~45 modules from source first, about a quarter
    of its start-up (issue 13); an installed wheel, or one run without that variable, caches them.
    """
    import importlib.util

    for source in (ROOT / "servesim").rglob("*.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        if not cached.is_file() or cached.stat().st_mtime < source.stat().st_mtime:
            return False
    return True


def compile_bytecode() -> None:
    """Write ``servesim``'s cached bytecode (``python -m compileall``), as installing a wheel does."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "servesim")], check=True,
                   stdout=subprocess.DEVNULL)


def write_json(path: str | None, figures: dict) -> None:
    """Write ``figures`` as indented JSON to ``path`` (nothing when ``path`` is None)."""
    if path:
        Path(path).write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")
