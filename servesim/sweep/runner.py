"""Run a sweep: every (point, replication) once, resumably, on any ``concurrent.futures.Executor``.

Each finished run is stored as soon as it finishes (one JSON file, written atomically, by this process:
workers only compute), so an interrupted sweep rerun with the same command skips the finished runs and
neither loses nor duplicates any. A stored run is reused only when its resolved inputs (run config, seed,
cards, referenced files, servesim version: :mod:`servesim.sweep.inputs`) are unchanged; the result says
how many were reused and what changed for the others. The sweep is expanded lazily, point by point. A
run that raises is recorded in ``failures.csv`` and the others go on.
At the end ``summary.csv`` (and ``speedup.csv`` when the sweep names a ``baseline``) are rebuilt from
every stored run of the sweep.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from servesim.atomic import (atomic_file, prepare_output_dir, remove_stale, remove_temporary_files,
                              replacing_outputs)
from servesim.errors import ConfigError, OutputFolderRefused, ServesimError
from servesim.sweep.executors import check_executor, open_executor
from servesim.sweep.inputs import InputResolver, RunInputs
from servesim.sweep.points import Point, count_points, iter_points, point_config, task_seed
from servesim.sweep.spec import LoadedSweep, SweepConfig, load_sweep, resolve_sweep
from servesim.sweep.store import point_path, read_result, read_stored, to_jsonable, write_result
from servesim.sweep.tables import SPEEDUP_METRIC, speedup_frame, summary_frame, write_csv

Simulate = Callable[..., Any]

#: Tables rebuilt at the end of every invocation (removed when one is interrupted or fails).
SWEEP_TABLES = ("summary.csv", "speedup.csv")

#: What ``servesim plot DIR`` draws into a sweep's folder from its tables (with ``heatmap_*``): removed when a
#: sweep changes ``summary.csv`` or is interrupted, so that no figure of an earlier table looks current.
#: Each figure's files, by the figure's name (its PNG's stem).
PLOT_FIGURE_FILES = {
    "latency_vs_throughput": ("latency_vs_throughput.png", "latency_vs_throughput.svg", "latency_vs_throughput.csv"),
    "acceptance": ("acceptance.png", "acceptance.svg", "acceptance.csv"),
    "speedup": ("speedup.png", "speedup.svg", "speedup_curve.csv"),
}
PLOT_FIGURES = tuple(name for names in PLOT_FIGURE_FILES.values() for name in names)


def plot_figures(out: Path) -> list[str]:
    """The names of the figures (and their data) of :data:`PLOT_FIGURES` and ``heatmap_*`` in ``out``."""
    heatmaps = sorted(p.name for p in out.glob("heatmap_*") if p.suffix in (".png", ".svg", ".csv"))
    return [name for name in PLOT_FIGURES if (out / name).exists()] + heatmaps


@dataclass(frozen=True)
class Task:
    """One run of the simulator: a point's config with one replication's seed (picklable).

    ``inputs`` are the run's resolved inputs; their digest is the resume key (see
    :mod:`servesim.sweep.inputs`).
    """

    point: Point
    replication: int
    seed: int
    config: dict[str, Any]
    inputs: RunInputs

    @property
    def digest(self) -> str:
        """The resume key: SHA-256 of the resolved inputs."""
        return self.inputs.digest


@dataclass(frozen=True)
class Failure:
    """A run that raised: which one (``swept``: its swept values as ``key=value, ...``, empty for the base
    point), and the error as one line."""

    point_id: str
    replication: int
    seed: int
    variant: str
    swept: str
    overrides: str
    error: str


def swept_values(point) -> str:
    """A point's swept values as messages write them: ``key=value, ...`` in the sweep file's order."""
    return ", ".join(f"{k}={v!r}" for k, v in point.axes.items())


@dataclass
class SweepResult:
    """What :func:`run_sweep` did.

    Attributes:
        out_dir: the output folder.
        summary: the summary table (also in ``out_dir/summary.csv``).
        speedup: the speedup table, or None without a baseline (also in ``out_dir/speedup.csv``).
        num_runs: (point, replication) pairs in the sweep.
        num_skipped: runs already stored by an earlier invocation with the same inputs (reused).
        num_run: runs executed by this invocation (finished or failed).
        failures: runs that raised in this invocation (also in ``out_dir/failures.csv``).
        stale: why stored runs were run again: what changed (``"seed"``, ``"hardware/model card"``,
            ``"file PATH"``, ...) -> number of runs.
        num_stale: stored runs whose inputs changed, run again by this invocation.
        unreadable: stored runs that could not be read (empty, truncated, not a run record), run again by
            this invocation: their files, relative to ``out_dir``.
    """

    out_dir: Path
    summary: pd.DataFrame
    speedup: pd.DataFrame | None
    num_runs: int
    num_skipped: int
    num_run: int
    failures: list[Failure] = field(default_factory=list)
    stale: dict[str, int] = field(default_factory=dict)
    num_stale: int = 0
    unreadable: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        """0 when every run finished, 1 when any failed."""
        return 1 if self.failures else 0


def error_line(exc: BaseException) -> str:
    """One line describing ``exc``: a ServesimError's own message, else ``Type: first line``."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, ServesimError):
        return text or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def execute_task(simulate: Simulate, config: dict[str, Any], seed: int, base_dir: str) -> tuple[bool, Any]:
    """Run one simulation (in a worker) and return ``(True, summary)`` or ``(False, one-line error)``.

    ``simulate(config, seed=seed, base_dir=base_dir)`` returns a Result with a ``summary`` mapping (or
    the mapping itself); the summary comes back as plain JSON types. Exceptions (not KeyboardInterrupt
    or SystemExit) become ``(False, message)`` so that every executor reports them the same way.
    """
    try:
        result = simulate(config, seed=seed, base_dir=base_dir)
        summary = result if isinstance(result, dict) else result.summary
        return True, to_jsonable(summary)
    except Exception as exc:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
        return False, error_line(exc)


def _default_simulate() -> Simulate:
    try:
        from servesim import simulate  # type: ignore[attr-defined]
    except ImportError:
        raise ServesimError("servesim.simulate is not available in this installation") from None
    return simulate


def _load(sweep: str | Path | SweepConfig | LoadedSweep) -> LoadedSweep:
    if isinstance(sweep, LoadedSweep):
        return sweep
    if isinstance(sweep, SweepConfig):
        return resolve_sweep(sweep, Path.cwd(), "sweep")
    return load_sweep(sweep)


#: Bytes of a ``sweep.json`` read to tell a sweep's manifest from another file of that name.
_MANIFEST_HEAD_BYTES = 1 << 20


def is_sweep_manifest(path: Path) -> bool:
    """Whether ``path`` is a sweep's ``sweep.json`` as :func:`_write_manifest` writes it (a JSON object whose
    head names the sweep's ``source`` and ``columns``), not merely a file of that name."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_MANIFEST_HEAD_BYTES)
    except OSError:
        return False
    return head.lstrip().startswith(b"{") and b'"source":' in head and b'"columns":' in head


def check_same_sweep(out_dir: Path, sweep: LoadedSweep) -> None:
    """Refuse an output folder that holds another sweep's runs (its ``sweep.json`` names a sweep file of
    another name): the new sweep would replace the tables and leave the other's runs in ``points/``. A
    changed grid of the same sweep file resumes as usual (changed points run again), and a sweep given in
    Python (a :class:`SweepConfig`, source ``"sweep"``) is not checked.

    A folder without ``sweep.json`` (every sweep writes it before its first run) that holds files of a
    sweep's names (its tables, ``failures.csv``, the figures ``servesim plot`` draws) is refused too: they
    are someone else's, which the sweep would replace or remove.

    Raises:
        OutputFolderRefused: one line naming the folder and both sweeps, or the files found (nothing in it
            is touched).
    """
    points = out_dir / "points"
    if (points.exists() or points.is_symlink()) and not points.is_dir():  # a file, or a link to none
        raise OutputFolderRefused(f"--out: {points} is a file; a sweep keeps its stored runs in the folder points/ "
                                  "there: give another folder, or move that file")
    manifest = out_dir / "sweep.json"
    if not is_sweep_manifest(manifest):
        found = [name for name in ("sweep.json", *SWEEP_TABLES, "failures.csv") if (out_dir / name).exists()]
        found += plot_figures(out_dir) if out_dir.is_dir() else []
        if found:
            what = "a sweep.json that is not a sweep's" if manifest.exists() else "no sweep.json"
            raise OutputFolderRefused(f"--out: {out_dir} holds {', '.join(found)} but {what} (not a sweep's "
                                      f"folder); give {sweep.source} another folder, or remove them first")
        return
    try:
        earlier = json.loads(manifest.read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError):
        return  # a manifest servesim cannot read: nothing to protect
    if "sweep" in (earlier, sweep.source):  # a SweepConfig given in Python has no file to tell it by
        return
    if isinstance(earlier, str) and Path(earlier).name != Path(sweep.source).name:
        raise OutputFolderRefused(f"--out: {out_dir} holds the runs of another sweep ({earlier}); give "
                                  f"{sweep.source} another folder, or remove that one first")


def _write_manifest(out_dir: Path, sweep: LoadedSweep) -> None:
    """Write ``sweep.json``, the points streamed one per line (memory does not grow with the sweep)."""
    cfg = sweep.config
    head = {
        "source": sweep.source,
        "base_dir": str(sweep.base_dir),
        "columns": cfg.column_names(),
        "units": sweep.column_units(),
        "workload_types": sorted(str(t) for t in sweep.workload_types()),  # "None": a type that cannot be told
        "variants": list(cfg.variants),
        "baseline": cfg.baseline,
        "replications": cfg.replications,
        "seed": cfg.seed,
        "num_points": count_points(sweep),
    }
    with atomic_file(out_dir / "sweep.json", "w", fsync=True, encoding="utf-8", newline="") as handle:
        handle.write(json.dumps(to_jsonable(head), indent=1)[:-2] + ',\n "points": [')
        for i, p in enumerate(iter_points(sweep)):
            point = {"point_id": p.point_id, "variant": p.variant, "axes": p.axes,
                     "variant_overrides": p.variant_overrides}
            handle.write(("," if i else "") + "\n  " + json.dumps(to_jsonable(point), separators=(",", ":")))
        handle.write("\n ]\n}\n")


def _remove_temporary_files(out: Path) -> None:
    """Delete the temporary files that killed writes of a sweep's own files left in ``out`` and ``points/``
    (:func:`~servesim.atomic.atomic_file`'s ``.NAME.*.tmp``); other files are left alone.

    Raises:
        ConfigError: one cannot be removed.
    """
    for name in ("sweep.json", "failures.csv", *SWEEP_TABLES, *PLOT_FIGURES, "heatmap_*"):
        remove_temporary_files(out, name)
    remove_temporary_files(out / "points", "[0-9a-f]" * 12 + "-r*.json")  # point_path's files


def _write_failures(out_dir: Path, failures: list[Failure]) -> None:
    path = out_dir / "failures.csv"
    if not failures:
        path.unlink(missing_ok=True)
        return
    frame = pd.DataFrame([f.__dict__ for f in failures], columns=list(Failure.__dataclass_fields__))
    write_csv(frame, path)


def _check_configs(loaded: LoadedSweep, show: bool = False) -> None:
    """Validate every point's run config up front (one point at a time; a tqdm bar on stderr with ``show``),
    with the cards it names and the input files its workload reads (each distinct one loaded or found
    once): a grid value naming an unknown card or profile or a missing trace would otherwise fail in every
    run of it.

    Raises:
        ConfigError: one line naming the sweep file, the point (its variant by name, its swept values) and
            the bad field.
    """
    from tqdm import tqdm

    from servesim.input_files import validate
    from servesim.config.models import SimConfig

    inputs_seen: set[str] = set()
    files_seen: set[Path] = set()
    points = iter_points(loaded)
    for point in tqdm(points, total=count_points(loaded), disable=not show, unit="point", desc="check"):
        # the variant by its name: its overrides (a whole speculative_config) do not say which one it is
        variant = [f"variant {point.variant!r}"] if loaded.config.variants else []
        axes = swept_values(point)
        where = ", ".join(variant + ([f"point {axes}"] if axes else [])) or "point base"
        source = f"{loaded.source} ({where})"
        cfg = validate(SimConfig, point_config(loaded, point), source)
        _check_point_inputs(cfg, loaded.base_dir, source, inputs_seen, files_seen)


def _check_point_inputs(cfg, base_dir: Path, source: str, inputs_seen: set[str], files_seen: set[Path]) -> None:
    """The cards and the acceptance profile ``cfg`` names load, and every ``path`` in its workload (a trace,
    an empirical lengths file) is a file; ``inputs_seen`` (cards and profiles) and ``files_seen`` hold what
    earlier points already passed.

    Raises:
        ConfigError: ``SOURCE: FIELD: ...`` for an unknown or invalid card or profile or a missing input file.
    """
    from servesim.sweep.canonical import canonical_json
    from servesim.wiring import resolve_cards
    from servesim.workload.lengths import resolve_path

    cards = canonical_json(cfg.model_dump(mode="json", include={"hardware", "model", "roofline"}))
    if cards not in inputs_seen:
        try:
            resolve_cards(cfg, base_dir)
        except ServesimError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        inputs_seen.add(cards)
    spec = None
    if cfg.speculative_config is not None:
        from servesim.input_files import validate
        from servesim.speculation.config import SpeculativeConfig

        spec = validate(SpeculativeConfig, cfg.speculative_config, f"{source}: speculative_config")
    if spec is not None and spec.synthetic_profile() is None:
        from servesim.speculation.config import DEFAULT_PROFILES
        from servesim.speculation.profile import load_profile

        profile = spec.acceptance if spec.acceptance is not None else DEFAULT_PROFILES[spec.method]
        key = canonical_json({"acceptance": profile if isinstance(profile, (str, dict)) else str(profile)})
        if key not in inputs_seen:
            try:
                load_profile(profile, base_dir=base_dir, source="speculative_config.acceptance")
            except ServesimError as exc:
                raise ConfigError(f"{source}: {exc}") from None
            inputs_seen.add(key)
    for field, text in _workload_paths(cfg.workload.model_dump(mode="python"), "workload"):
        path = resolve_path(text, base_dir)
        if path not in files_seen:
            if not path.is_file():
                raise ConfigError(f"{source}: {field}: file not found: {path}")
            files_seen.add(path)


def _workload_paths(data: Any, field: str) -> Iterator[tuple[str, str]]:
    """``(dotted field, path)`` of every string under a key named ``path`` in a workload mapping."""
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "path" and isinstance(value, str):
                yield f"{field}.{key}", value
            else:
                yield from _workload_paths(value, f"{field}.{key}")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _workload_paths(value, f"{field}[{index}]")


def count_runs(sweep: LoadedSweep) -> tuple[int, int]:
    """``(points, runs)`` of a sweep (runs = points x replications), without expanding it."""
    points = count_points(sweep)
    return points, points * sweep.config.replications


def check_size(sweep: LoadedSweep, max_runs: int | None) -> None:
    """Refuse a sweep of more than ``max_runs`` runs (None: no limit).

    Raises:
        ConfigError: one line with the count and how to confirm it (``--yes``).
    """
    points, runs = count_runs(sweep)
    if max_runs is not None and runs > max_runs:
        raise ConfigError(
            f"{sweep.source}: {points:,} points x {sweep.config.replications} replication(s) = {runs:,} runs, "
            f"more than {max_runs:,}: pass --yes to run them all, or shrink the grid"
        )


def _tasks(loaded: LoadedSweep, resolver: InputResolver) -> Iterator[Task]:
    """Every (point, replication) of the sweep, one at a time."""
    replications = loaded.config.replications
    for point in iter_points(loaded):
        config = point_config(loaded, point)
        for rep in range(replications):
            seed = task_seed(loaded.config.seed, point, rep)
            yield Task(point, rep, seed, config, resolver.resolve(config, seed))


def run_sweep(
    sweep: str | Path | SweepConfig | LoadedSweep,
    out_dir: str | Path,
    *,
    jobs: int = 1,
    executor: str | Executor | None = None,
    progress: bool | None = None,
    simulate: Simulate | None = None,
    max_runs: int | None = None,
) -> SweepResult:
    """Run every (point, replication) of a sweep that is not already stored in ``out_dir``.

    The sweep is expanded lazily (one point at a time), so memory does not grow with the number of
    points; at most a few runs per worker are in flight at once.

    Args:
        sweep: a sweep file path, a :class:`SweepConfig` (a ``base`` path resolves against the current
            folder) or a loaded sweep.
        out_dir: output folder (created); see :mod:`servesim.sweep.store` for its layout.
        jobs: local worker processes (1 = serial in this process).
        executor: ``None``/``"local"``, ``"dask"``, ``"dask://HOST:PORT"``, or an Executor instance
            (see :func:`servesim.sweep.executors.open_executor`).
        progress: show a tqdm bar on stderr; ``None`` = only when stderr is a terminal.
        simulate: the simulator, ``simulate(config, *, seed, base_dir) -> Result`` (default
            ``servesim.simulate``); it must be picklable (a module-level function) for process and Dask
            executors.
        max_runs: refuse a sweep of more runs than this (None: no limit; the CLI's ``--yes`` lifts its
            limit :data:`servesim.cli.sweep.MAX_RUNS_WITHOUT_YES`).

    Returns:
        a :class:`SweepResult`; its ``exit_status`` is 1 when any run failed.

    Raises:
        ConfigError: invalid sweep file, base config, overrides, ``jobs`` or ``executor``, an unwritable
            ``out_dir``, or more runs than ``max_runs``.
        KeyboardInterrupt: propagated after the finished runs have been stored.
    """
    from tqdm import tqdm

    loaded = _load(sweep)
    check_size(loaded, max_runs)
    check_executor(executor, jobs)
    out = Path(out_dir)
    show = sys.stderr.isatty() if progress is None else bool(progress)
    simulate = simulate if simulate is not None else _default_simulate()
    if getattr(simulate, "__module__", "") == "servesim.api":
        _check_configs(loaded, show)  # a typo in a swept key fails here, once, before any run
    prepare_output_dir(out)  # before any run: an unwritable --out fails at once, in one line
    check_same_sweep(out, loaded)

    resolver = InputResolver(loaded.base_dir)
    num_runs = count_runs(loaded)[1]
    failures: list[Failure] = []
    stale: dict[str, int] = {}
    unreadable: list[str] = []
    counts = {"reused": 0, "run": 0, "stale": 0}
    order: dict[tuple[str, int], int] = {}  # (point, replication) -> its place in the sweep's order
    base_dir = str(loaded.base_dir)
    bar = tqdm(total=num_runs, disable=not show, unit="run", desc="sweep")

    def pending() -> Iterator[Task]:
        for task in _tasks(loaded, resolver):
            record = read_stored(out, task.point.point_id, task.replication)
            if record is not None and record.get("inputs_sha256") == task.digest:
                counts["reused"] += 1
                bar.update(1)
                continue
            if record is not None:
                counts["stale"] += 1
                for what in task.inputs.differences(record.get("inputs")):
                    stale[what] = stale.get(what, 0) + 1
            elif (path := point_path(out, task.point.point_id, task.replication)).exists():
                unreadable.append(str(path.relative_to(out)))
            counts["run"] += 1
            order[(task.point.point_id, task.replication)] = len(order)
            yield task

    def finish(task: Task, ok: bool, payload: Any) -> None:
        if ok:
            record = {
                "point_id": task.point.point_id,
                "replication": task.replication,
                "seed": task.seed,
                "variant": task.point.variant,
                "axes": to_jsonable(task.point.axes),
                "inputs_sha256": task.digest,
                "inputs": task.inputs.as_json(),
                "summary": payload,
            }
            write_result(out, record)
        else:
            overrides = json.dumps(to_jsonable(task.point.overrides()), sort_keys=True, separators=(",", ":"))
            failures.append(
                Failure(task.point.point_id, task.replication, task.seed, task.point.variant,
                        swept_values(task.point), overrides, str(payload))
            )
        bar.update(1)

    figures = plot_figures(out)
    earlier_outputs = list(SWEEP_TABLES) + figures  # an earlier invocation's tables and the figures drawn from them
    try:
        # interrupted: an earlier invocation's tables (maybe of another grid) and the figures drawn from them
        # must not look like this one's
        # (the earlier tables and figures stay while it runs: figures of a table it writes again unchanged
        # still hold; a changed table removes them)
        with replacing_outputs(out, earlier_outputs, before=False), open_executor(executor, jobs) as pool:
            # once the workers are there (a Dask scheduler that cannot be reached leaves nothing behind)
            (out / "points").mkdir(parents=True, exist_ok=True)
            _remove_temporary_files(out)
            manifest = out / "sweep.json"
            earlier_manifest = manifest.read_bytes() if manifest.is_file() else None
            _write_manifest(out, loaded)
            if manifest.read_bytes() != earlier_manifest:
                # another grid, seed or baseline: the earlier tables and their figures are not this sweep's,
                # gone before any run (a kill that no handler sees must not leave them looking current)
                remove_stale(out, earlier_outputs)
            if pool is None:
                for task in pending():
                    finish(task, *execute_task(simulate, task.config, task.seed, base_dir))
            else:
                _run_windowed(pool, pending(), simulate, base_dir, finish, window=_window(jobs))
    finally:
        bar.close()
        # in the sweep's order, not the order the workers finished in: the same sweep lists the same failures
        failures.sort(key=lambda failure: order[(failure.point_id, failure.replication)])
        _write_failures(out, failures)

    records = []
    for task in _tasks(loaded, resolver):
        record = read_result(out, task.point.point_id, task.replication, task.digest)
        if record is not None:
            records.append((task.point, task.replication, record))
    summary = summary_frame(loaded, records)
    earlier = (out / "summary.csv").read_bytes() if (out / "summary.csv").is_file() else None
    write_csv(summary, out / "summary.csv")
    if figures and (out / "summary.csv").read_bytes() != earlier:
        remove_stale(out, figures)  # drawn by `servesim plot` from the earlier table
    speedup = None
    if loaded.config.baseline is None:
        remove_stale(out, ["speedup.csv"])  # from an earlier invocation that had a baseline
    else:
        if records and SPEEDUP_METRIC not in summary.columns:
            raise ServesimError(f"{loaded.source}: baseline: the summaries have no {SPEEDUP_METRIC} to compare")
        if SPEEDUP_METRIC in summary.columns:
            speedup = speedup_frame(loaded, summary)
            write_csv(speedup, out / "speedup.csv")
    return SweepResult(out, summary, speedup, num_runs, counts["reused"], counts["run"], failures, stale,
                       counts["stale"], unreadable)


def _window(jobs: int) -> int:
    """Runs kept in flight: enough to keep every worker of a local pool or a Dask cluster busy."""
    return max(4 * jobs, 256)


def _run_windowed(pool: Executor, tasks: Iterator[Task], simulate: Simulate, base_dir: str,
                  finish: Callable[[Task, bool, Any], None], *, window: int) -> None:
    """Submit ``tasks`` to ``pool`` keeping at most ``window`` in flight; ``finish`` each as it completes."""
    futures: dict[Future, Task] = {}
    exhausted = False
    while futures or not exhausted:
        while not exhausted and len(futures) < window:
            task = next(tasks, None)
            if task is None:
                exhausted = True
                break
            futures[pool.submit(execute_task, simulate, task.config, task.seed, base_dir)] = task
        if not futures:
            break
        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        for future in done:
            task = futures.pop(future)
            try:
                ok, payload = future.result()
            except Exception as exc:  # noqa: BLE001 - e.g. a worker died or a pickling error
                ok, payload = False, error_line(exc)
            finish(task, ok, payload)
