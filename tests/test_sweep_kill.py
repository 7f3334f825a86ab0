"""A killed sweep takes its worker processes with it (issue 11, item 1).

``servesim sweep --jobs 2`` runs in a subprocess on a sweep whose runs take minutes; once both workers
are busy the sweep process gets SIGTERM (what ``timeout``, Slurm and Kubernetes send) or SIGKILL, and
every worker must be gone within a few seconds. Every process a test starts is killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

#: Longest wait (s) for the workers to start, and for them to die after the sweep process is killed.
START_TIMEOUT_S = 60.0
DEATH_TIMEOUT_S = 10.0

# One run takes minutes in step mode (about 1.3 s per 2,000 requests), far longer than DEATH_TIMEOUT_S.
BASE = {
    "hardware": "h100-sxm",
    "model": "llama-3.1-8b",
    "simulation": {"mode": "step"},
    "workload": {"type": "poisson", "rate": 50.0, "num_requests": 200_000,
                 "prompt_tokens": {"type": "fixed", "value": 100}, "output_tokens": {"type": "fixed", "value": 500}},
}


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by whoever adopted it
    except psutil.NoSuchProcess:
        return True


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    """The sweep's worker processes (its children other than multiprocessing's resource tracker)."""
    found = []
    for child in parent.children():
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _kill_all(processes) -> None:
    for process in processes:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


@contextlib.contextmanager
def _sweep_process(tmp_path, *options: str, **popen_options):
    """Start ``servesim sweep --jobs 2`` (plus ``options``) on a sweep of minutes-long runs; yield (process,
    its psutil.Process, the list of processes seen, which the caller extends); kill them all at the end."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(
        {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64, 128, 256, 512]}}))
    log = (tmp_path / "log.txt").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "servesim", "sweep", str(tmp_path / "sweep.yaml"),
                             "--out", str(tmp_path / "out"), "--jobs", "2", "--no-progress", *options],
                            stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[1],
                            **popen_options)
    parent = psutil.Process(proc.pid)
    seen: list[psutil.Process] = []
    try:
        yield proc, parent, seen
    finally:
        try:
            seen.extend(parent.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
        _kill_all(seen + [parent])
        proc.wait(timeout=30)
        log.close()


def _wait_until_gone(family: list[psutil.Process]) -> list[int]:
    """Wait up to DEATH_TIMEOUT_S for ``family`` to die; return the pids still alive."""
    deadline = time.monotonic() + DEATH_TIMEOUT_S
    while time.monotonic() < deadline and not all(_gone(w) for w in family):
        time.sleep(0.1)
    return [w.pid for w in family if not _gone(w)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sends POSIX signals and reads /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_killed_sweep_leaves_no_workers(tmp_path, signum):
    with _sweep_process(tmp_path) as (proc, parent, seen):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            workers = _workers(parent)
            seen.extend(w for w in workers if w not in seen)
            if len(workers) >= 2 and all(w.cpu_times().user > 0.2 for w in workers):  # both are simulating
                break
            time.sleep(0.1)
        assert proc.poll() is None and len(_workers(parent)) >= 2, (tmp_path / "log.txt").read_text()
        workers = _workers(parent)
        seen.extend(w for w in workers if w not in seen)
        family = parent.children(recursive=True)
        proc.send_signal(signum)
        status = proc.wait(timeout=DEATH_TIMEOUT_S + 20)
        alive = _wait_until_gone(family)
        assert alive == [], f"processes left running after {signal.Signals(signum).name}: {alive}"
        if signum == signal.SIGTERM:
            log = (tmp_path / "log.txt").read_text()
            assert status == 143 and "terminated (SIGTERM)" in log
            assert "Exception ignored" not in log and "Traceback" not in log, log


def _slow_square(value: int) -> int:
    time.sleep(60)
    return value * value


def test_an_interrupted_local_pool_leaves_no_thread_running_into_exit():
    # the pool's manager thread, left running after shutdown(wait=False), could write to a closed pipe at
    # interpreter exit ("Exception ignored ... Bad file descriptor"): it is joined once the workers are gone
    import threading
    from concurrent.futures import process

    from servesim.sweep.executors import _local_pool

    with pytest.raises(KeyboardInterrupt):
        with _local_pool(2) as pool:
            futures = [pool.submit(_slow_square, i) for i in range(4)]
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and not any(f.running() for f in futures):
                time.sleep(0.05)
            raise KeyboardInterrupt
    managers = [t for t in threading.enumerate() if isinstance(t, process._ExecutorManagerThread)]
    assert [t for t in managers if t.is_alive()] == []


try:
    import distributed  # noqa: F401

    HAS_DASK = True
except ImportError:  # the optional extra servesim[dask]
    HAS_DASK = False

#: Worker CPU time (s) after which a Dask worker has surely run its preload (its imports take about 1 s).
DASK_WORKER_BUSY_CPU_S = 4.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sends POSIX signals and reads /proc")
@pytest.mark.skipif(not HAS_DASK, reason="dask.distributed is not installed (optional extra servesim[dask])")
def test_ctrl_c_of_a_dask_sweep_prints_one_line_and_leaves_no_workers(tmp_path):
    # Ctrl-C in a terminal reaches the whole process group, Dask's worker processes included: they ignore
    # it (servesim.sweep.dask_worker), the sweep's process closes the cluster, and the user sees one line
    with _sweep_process(tmp_path, "--executor", "dask", start_new_session=True,
                        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as (proc, parent, seen):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            workers = [w for w in _workers(parent) if "spawn_main" in " ".join(w.cmdline())]
            seen.extend(w for w in workers if w not in seen)
            if len(workers) >= 2 and all(w.cpu_times().user > DASK_WORKER_BUSY_CPU_S for w in workers):
                break
            time.sleep(0.2)
        assert proc.poll() is None and len(seen) >= 2, (tmp_path / "log.txt").read_text()
        family = parent.children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=DEATH_TIMEOUT_S + 30)
        alive = _wait_until_gone(family)
        assert alive == [], f"processes left running after Ctrl-C: {alive}"
        text = (tmp_path / "log.txt").read_text()
        assert status == 130 and "servesim: interrupted" in text
        assert "Traceback" not in text and "WARNING" not in text and "ERROR" not in text, text
