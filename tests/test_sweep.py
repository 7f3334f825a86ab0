"""Tests of servesim.sweep: expansion, stable ids and seeds, resumable runner, executors, tables."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import servesim
from servesim.errors import ConfigError
from servesim.cli import sweep as command
from servesim.sweep.points import expand_points, point_config, seed_sequence, task_seed
from servesim.sweep import tables
from servesim.sweep.runner import run_sweep
from servesim.sweep.spec import SweepConfig, load_sweep

REPO = Path(__file__).resolve().parents[1]
HAS_DASK = importlib.util.find_spec("distributed") is not None

BASE = {
    "hardware": "h100-sxm",
    "model": "llama-3.1-8b",
    "tensor_parallel_size": 1,
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 8192},
    "workload": {
        "type": "poisson",
        "rate": 4.0,
        "num_requests": 50,
        "prompt_tokens": {"type": "fixed", "value": 512},
        "output_tokens": {"type": "fixed", "value": 128},
    },
    "seed": 0,
}

FULL_SWEEP = {
    "base": "base.yaml",
    "grid": {"engine.max_num_seqs": [64, 256], "workload.rate_scale": [1, 2, 4]},
    "zip": [{"hardware": ["h100-sxm", "h200-sxm"], "engine.max_num_batched_tokens": [8192, 16384]}],
    "variants": {"plain": {}, "eagle": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 3}}},
    "baseline": "plain",
    "replications": 2,
    "seed": 7,
}


# --- a fake simulator: a deterministic function of the config and the seed --------------------------


class FakeResult:
    def __init__(self, summary: dict) -> None:
        self.summary = summary


CALLS: list[tuple[str, int]] = []
CRASH_AFTER: list[int] = []  # when non-empty, raise KeyboardInterrupt once len(CALLS) reaches it


def expected_throughput(max_num_seqs: int, rate_scale: float, k: int, seed: int) -> float:
    """The fake's output_throughput (tokens/s): a closed form plus one uniform draw from the seed."""
    return max_num_seqs * rate_scale * 10.0 * (1.0 + 0.5 * k) + float(np.random.default_rng(seed).random())


def fake_simulate(config, *, seed=None, base_dir=None):
    if CRASH_AFTER and len(CALLS) >= CRASH_AFTER[0]:
        raise KeyboardInterrupt
    CALLS.append((json.dumps(config, sort_keys=True), seed))
    assert Path(base_dir).is_dir()
    spec = config.get("speculative_config") or {}
    k = spec.get("num_speculative_tokens", 0)
    scale = config["workload"].get("rate_scale", 1)
    out = expected_throughput(config["engine"]["max_num_seqs"], scale, k, seed)
    rng = np.random.default_rng(seed)
    ttft = rng.exponential(0.1, size=100)
    return FakeResult(
        {
            "num_requests": config["workload"]["num_requests"],
            "completed": np.int64(config["workload"]["num_requests"]),
            "output_throughput": out,
            "ttft_s": {"mean": float(ttft.mean()), "p99": float(np.percentile(ttft, 99))},
            "saturated": bool(scale > 2),
            "per_replica": [1, 2],
        }
    )


def failing_simulate(config, *, seed=None, base_dir=None):
    if config["engine"]["max_num_seqs"] == 256 and "speculative_config" in config:
        raise ValueError("boom: verification overflow\nsecond line of detail")
    return fake_simulate(config, seed=seed, base_dir=base_dir)


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()
    CRASH_AFTER.clear()
    yield
    CALLS.clear()
    CRASH_AFTER.clear()


def write_sweep(folder: Path, sweep: dict, base: dict | None = None, name: str = "sweep.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(yaml.safe_dump(base or BASE), encoding="utf-8")
    path = folder / name
    path.write_text(yaml.safe_dump(sweep, sort_keys=False), encoding="utf-8")
    return path


def read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path)


# --- expansion ---------------------------------------------------------------------------------------


def test_grid_zip_variants_expand_to_full_product(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, FULL_SWEEP))
    points = expand_points(sweep)
    assert len(points) == 2 * 3 * 2 * 2
    got = {(p.variant, tuple(p.axes.items())) for p in points}
    want = {
        (v, (("engine.max_num_seqs", n), ("workload.rate_scale", r), ("hardware", hw),
             ("engine.max_num_batched_tokens", t)))
        for v in ("plain", "eagle")
        for n in (64, 256)
        for r in (1, 2, 4)
        for hw, t in (("h100-sxm", 8192), ("h200-sxm", 16384))
    }
    assert got == want
    assert [p.index for p in points] == list(range(24))
    assert len({p.point_id for p in points}) == 24
    assert all(len(p.point_id) == 12 and int(p.point_id, 16) >= 0 for p in points)
    # variants vary fastest, then the zip group, then the grid (last key fastest)
    assert [p.variant for p in points[:2]] == ["plain", "eagle"]
    assert points[2].axes["hardware"] == "h200-sxm"


def test_point_config_applies_variant_then_axes(tmp_path):
    sweep_dict = {
        "base": "base.yaml",
        "grid": {"speculative_config.num_speculative_tokens": [1, 5]},
        "variants": {"eagle": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 3}}},
    }
    sweep = load_sweep(write_sweep(tmp_path, sweep_dict))
    configs = [point_config(sweep, p) for p in expand_points(sweep)]
    assert [c["speculative_config"] for c in configs] == [
        {"method": "eagle", "num_speculative_tokens": 1},
        {"method": "eagle", "num_speculative_tokens": 5},
    ]
    assert sweep.base == BASE  # the base is never modified
    assert configs[0]["engine"] == BASE["engine"]


def test_inline_base_and_no_axes_gives_one_default_point(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"base": BASE}), encoding="utf-8")
    sweep = load_sweep(path)
    points = expand_points(sweep)
    assert [(p.variant, p.axes) for p in points] == [("default", {})]
    assert point_config(sweep, points[0]) == BASE
    assert sweep.base_dir == tmp_path.resolve()


def test_ids_and_seeds_depend_on_content_not_position(tmp_path):
    small = load_sweep(write_sweep(tmp_path / "a", {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64, 256]},
                                                   "replications": 3, "seed": 11}))
    large = load_sweep(write_sweep(tmp_path / "b", {"base": "base.yaml",
                                                   "grid": {"engine.max_num_seqs": [256, 32, 64, 128]},
                                                   "replications": 3, "seed": 11}))
    by_value = {p.axes["engine.max_num_seqs"]: p for p in expand_points(large)}
    for p in expand_points(small):
        q = by_value[p.axes["engine.max_num_seqs"]]
        assert q.point_id == p.point_id
        assert [task_seed(11, q, r) for r in range(3)] == [task_seed(11, p, r) for r in range(3)]
    seeds = [task_seed(11, p, r) for p in expand_points(large) for r in range(3)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**63 for s in seeds)
    assert [task_seed(12, p, 0) for p in expand_points(small)] != [task_seed(11, p, 0) for p in expand_points(small)]


def test_seed_is_drawn_from_the_content_keyed_child_sequence(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, FULL_SWEEP))
    point = expand_points(sweep)[5]
    child = seed_sequence(7, point, 1)
    assert child.entropy == 7 and child.spawn_key == (point.key_int, 1)
    # the seed key is the point's swept values alone: its variants share it (common random numbers)
    siblings = [p for p in expand_points(sweep) if p.axes == point.axes]
    assert len(siblings) > 1 and len({p.key_int for p in siblings}) == 1
    assert len({p.point_id for p in siblings}) == len(siblings)
    hi, lo = np.random.SeedSequence(entropy=7, spawn_key=(point.key_int, 1)).generate_state(2, dtype=np.uint32)
    assert task_seed(7, point, 1) == ((int(hi) << 32) | int(lo)) >> 1


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"zip": [{"hardware": ["h100-sxm", "h200-sxm"], "engine.max_num_batched_tokens": [8192]}]}, "equal lengths"),
        ({"baseline": "nope"}, "baseline"),
        ({"grid": {"engine.max_num_seqs": []}}, "empty list"),
        ({"grid": {"hardware": [1]}}, "swept twice"),
        ({"grid": {"engine": [{}], "engine.max_num_seqs": [1]}}, "lies inside"),
        ({"columns": {"workload.concurrency": "batch_size"}}, "not a swept key"),
        ({"columns": {"engine.max_num_seqs": "seed"}}, "reserved"),
        # a rename onto a metric column overwrote that metric in summary.csv
        ({"columns": {"engine.max_num_seqs": "ttft_s.mean"}},
         "columns: 'ttft_s.mean' would take the place of the metric column 'ttft_s.mean' of summary.csv"),
        ({"columns": {"engine.max_num_seqs": "output_throughput"}}, "the metric column 'output_throughput'"),
        # a value listed twice ran the point twice (two rows with one point_id)
        ({"grid": {"engine.max_num_seqs": [4, 8, 4]}}, "lists the value 4 twice"),
        ({"grid": {"engine.max_num_seqs": [4, 4.0]}}, "lists the value 4.0 twice"),  # the same number
        # a variant's key inside a swept key was replaced by the swept value: the variants ran alike
        ({"grid": {"workload": [{"type": "poisson"}]}, "variants": {"fast": {"workload.rate": 30}, "slow": {}}},
         "variant 'fast': 'workload.rate' lies inside swept key 'workload', whose swept values replace it"),
        # the same key as a nested mapping: it was silently replaced (the variants ran alike), and only the
        # dotted form was refused
        ({"variants": {"plain": {}, "small": {"engine": {"max_num_seqs": 4}}}},
         "variant 'small': 'engine.max_num_seqs' lies inside swept key 'engine.max_num_seqs', whose swept "
         "values replace it (the variant would change nothing)"),
        ({"variants": {"plain": {}, "deep": {"engine": {"kv": {"x": 1}}, "workload.rate_scale": 3}}},
         "variant 'deep': 'workload.rate_scale' lies inside swept key 'workload.rate_scale'"),
        ({"variants": {"plain": {}, "both": {"engine": {"max_num_seqs": 4}, "workload": {"rate_scale": 3}}}},
         "variant 'both': 'engine.max_num_seqs' lies inside swept key 'engine.max_num_seqs', whose swept values "
         "replace it, as they replace every key the variant sets (the variant would change nothing)"),
        ({"zip": [{"engine.max_num_batched_tokens": [512, 512], "engine.block_size": [16, 16]}]},
         "zip group 0 lists the values {'engine.max_num_batched_tokens': 512, 'engine.block_size': 16} twice"),
        # one zip group without its list ("zip: Input should be a valid list" named no remedy)
        ({"zip": {"engine.max_num_batched_tokens": [512, 1024]}},
         "zip: expected a list of groups, each a mapping of dotted keys to equal-length lists "
         "(- {hardware: [h100-sxm, h200-sxm], engine.max_num_seqs: [64, 128]}), got a mapping"),
        ({"replications": 0}, "replications"),
        # the sweep seeds every run itself: a variant's seed never reached its runs, which ran as the others'
        ({"variants": {"plain": {}, "other": {"seed": 3}}, "baseline": "plain"},
         "variant 'other': 'seed': the sweep seeds every run itself (from its own seed and each point's swept "
         "values), so a run config's seed set here is never used"),
        ({"grid": {"seed": [1, 2]}, "columns": {"seed": "s"}}, "grid or zip key 'seed': the sweep seeds every run"),
        ({"zip": [{"seed": [1, 2], "engine.block_size": [16, 32]}]}, "grid or zip key 'seed': the sweep seeds"),
        ({"grids": {}}, "unknown key"),
        ({"grid": {"engine..max_num_seqs": [1]}}, "invalid key"),
    ],
)
def test_invalid_sweep_files_give_one_line_config_error(tmp_path, change, needle):
    sweep = dict(FULL_SWEEP)
    sweep.update(change)
    path = write_sweep(tmp_path, sweep)
    with pytest.raises(ConfigError) as exc:
        load_sweep(path)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(str(path)) and needle in text


def test_a_variant_mapping_partly_replaced_by_swept_keys_is_kept_and_named(tmp_path):
    # leaves of a variant's mapping outside every swept key apply; those a swept key replaces are named (the
    # sweep command prints them as notes), not refused, as a whole speculative_config beside a swept k is
    sweep = dict(FULL_SWEEP, variants={"plain": {}, "small": {"engine": {"max_num_seqs": 4, "block_size": 32}}})
    config = load_sweep(write_sweep(tmp_path, sweep)).config
    assert config.variants["small"] == {"engine": {"max_num_seqs": 4, "block_size": 32}}
    assert config.replaced_variant_leaves() == [
        "variant 'small': engine.max_num_seqs is replaced by the swept values of engine.max_num_seqs"]
    assert load_sweep(write_sweep(tmp_path, FULL_SWEEP)).config.replaced_variant_leaves() == []


@pytest.mark.parametrize("base, got", [(5, " (got 5)"), (None, " (got None)"), (["a.yaml"], " (got a list)"),
                                       ("", " (got '')")])
def test_a_base_that_is_no_path_or_mapping_says_what_base_takes(tmp_path, base, got):
    # a number read "base: Input should be a valid string (got 5) [and 1 more error]": base may be a mapping too
    path = write_sweep(tmp_path, {"base": base})
    with pytest.raises(ConfigError) as exc:
        load_sweep(path)
    assert str(exc.value) == (f"{path}: base: expected the path of a run config file (relative to the sweep file) "
                              f"or an inline mapping of run settings{got}")


def test_missing_base_file_is_named(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("base: nowhere.yaml\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="nowhere.yaml: file not found"):
        load_sweep(path)


def test_override_into_scalar_is_config_error(tmp_path):
    path = write_sweep(tmp_path, {"base": "base.yaml", "grid": {"model.name": ["x"]}})
    with pytest.raises(ConfigError, match="'model' holds"):
        run_sweep(path, tmp_path / "out", progress=False, simulate=fake_simulate)


# --- the runner --------------------------------------------------------------------------------------


def check_summary_against_fake(frame: pd.DataFrame) -> None:
    for _, row in frame.iterrows():
        k = 3 if row["variant"] == "eagle" else 0
        want = expected_throughput(row["engine.max_num_seqs"], row["workload.rate_scale"], k, int(row["seed"]))
        assert row["output_throughput"] == want


def test_serial_run_writes_tidy_summary(tmp_path):
    path = write_sweep(tmp_path, FULL_SWEEP)
    result = run_sweep(path, tmp_path / "out", progress=False, simulate=fake_simulate)
    assert result.exit_status == 0 and result.num_runs == 48 and result.num_run == 48 and result.num_skipped == 0
    frame = read_csv(tmp_path / "out" / "summary.csv")
    assert list(frame.columns[:8]) == [
        "engine.max_num_seqs", "workload.rate_scale", "hardware", "engine.max_num_batched_tokens",
        "variant", "replication", "seed", "point_id",
    ]
    assert {"num_requests", "completed", "output_throughput", "ttft_s.mean", "ttft_s.p99", "saturated"} <= set(
        frame.columns
    )
    assert "per_replica" not in frame.columns  # lists have no cell
    assert len(frame) == 48 and not frame.duplicated(["point_id", "replication"]).any()
    points = expand_points(load_sweep(path))
    assert list(frame["point_id"]) == [p.point_id for p in points for _ in range(2)]
    assert list(frame["replication"]) == [0, 1] * 24
    assert list(frame["seed"]) == [task_seed(7, p, r) for p in points for r in range(2)]
    check_summary_against_fake(frame)
    assert len(list((tmp_path / "out" / "points").iterdir())) == 48
    assert not (tmp_path / "out" / "failures.csv").exists()
    manifest = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [p["point_id"] for p in manifest["points"]] == [p.point_id for p in points]


def test_resume_after_crash_runs_every_task_exactly_once(tmp_path):
    path = write_sweep(tmp_path, FULL_SWEEP)
    out = tmp_path / "out"
    CRASH_AFTER.append(5)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(path, out, progress=False, simulate=fake_simulate)
    first = list(CALLS)
    assert len(first) == 5
    stored = sorted(p.name for p in (out / "points").iterdir())
    assert len(stored) == 5 and all(name.endswith(".json") for name in stored)  # no temp files left
    CRASH_AFTER.clear()
    result = run_sweep(path, out, progress=False, simulate=fake_simulate)
    assert result.num_skipped == 5 and result.num_run == 43
    assert len(CALLS) == 48 and len(set(CALLS)) == 48  # every (config, seed) once across both runs
    frame = read_csv(out / "summary.csv")
    assert len(frame) == 48 and not frame.duplicated(["point_id", "replication"]).any()
    check_summary_against_fake(frame)
    before = (out / "summary.csv").read_bytes()
    CALLS.clear()
    again = run_sweep(path, out, progress=False, simulate=fake_simulate)
    assert CALLS == [] and again.num_skipped == 48
    assert (out / "summary.csv").read_bytes() == before


def test_rerun_after_adding_points_runs_only_new_ones(tmp_path):
    sweep = {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64, 256]}, "seed": 3}
    out = tmp_path / "out"
    run_sweep(write_sweep(tmp_path, sweep), out, progress=False, simulate=fake_simulate)
    old = read_csv(out / "summary.csv")
    CALLS.clear()
    sweep["grid"]["engine.max_num_seqs"] = [32, 64, 256]
    run_sweep(write_sweep(tmp_path, sweep), out, progress=False, simulate=fake_simulate)
    assert len(CALLS) == 1
    new = read_csv(out / "summary.csv")
    assert new.iloc[1:].reset_index(drop=True).equals(old)


def test_another_sweep_file_is_refused_in_a_sweeps_folder(tmp_path, capsys):
    """A different sweep into a sweep's folder replaced its tables and left its runs in points/."""
    sweep = {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64, 256]}}
    out = tmp_path / "out"
    run_sweep(write_sweep(tmp_path, sweep), out, progress=False, simulate=fake_simulate)
    before = (out / "summary.csv").read_bytes()
    other = write_sweep(tmp_path, {**sweep, "grid": {"engine.max_num_seqs": [32]}}, name="other.yaml")
    with pytest.raises(ConfigError) as info:
        run_sweep(other, out, progress=False, simulate=fake_simulate)
    assert str(info.value) == (f"--out: {out} holds the runs of another sweep ({tmp_path / 'sweep.yaml'}); give "
                               f"{other} another folder, or remove that one first")
    assert (out / "summary.csv").read_bytes() == before
    # the command refuses it before it prints the sweep's size
    from servesim.cli import main

    assert main(["sweep", str(other), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"servesim: error: --out: {out} holds the runs of another")
    # the same file with a changed grid resumes in its folder
    run_sweep(write_sweep(tmp_path, {**sweep, "grid": {"engine.max_num_seqs": [64, 128]}}), out, progress=False,
              simulate=fake_simulate)
    assert list(read_csv(out / "summary.csv")["engine.max_num_seqs"]) == [64, 128]


def test_a_folder_with_sweep_outputs_but_no_manifest_is_refused(tmp_path, capsys):
    """A sweep into a user's folder replaced its summary.csv and deleted its latency_vs_throughput.png."""
    from servesim.cli import main

    sweep = write_sweep(tmp_path, {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64]}})
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.csv").write_text("my,data\n")
    (out / "latency_vs_throughput.png").write_bytes(b"png")
    (out / "notes.txt").write_text("kept\n")
    with pytest.raises(ConfigError) as info:
        run_sweep(sweep, out, progress=False, simulate=fake_simulate)
    assert str(info.value) == (f"--out: {out} holds summary.csv, latency_vs_throughput.png but no sweep.json (not "
                               f"a sweep's folder); give {sweep} another folder, or remove them first")
    assert main(["sweep", str(sweep), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"servesim: error: {info.value}\n"
    assert sorted(p.name for p in out.iterdir()) == ["latency_vs_throughput.png", "notes.txt", "summary.csv"]
    assert (out / "summary.csv").read_text() == "my,data\n"
    # a sweep that fails before it starts (its file missing) leaves them alone too
    assert main(["sweep", str(tmp_path / "nosuch.yaml"), "--out", str(out)]) == 2
    capsys.readouterr()
    assert (out / "summary.csv").read_text() == "my,data\n" and (out / "latency_vs_throughput.png").exists()
    # a plain file where the stored runs go is said as such
    (out / "points").write_text("not a folder\n")
    with pytest.raises(ConfigError) as info:
        run_sweep(sweep, out, progress=False, simulate=fake_simulate)
    assert str(info.value) == (f"--out: {out / 'points'} is a file; a sweep keeps its stored runs in the folder "
                               "points/ there: give another folder, or move that file")
    (out / "points").unlink()
    (out / "points").symlink_to(tmp_path / "nowhere")  # a dangling link: said the same way
    with pytest.raises(ConfigError, match=r"points is a file; a sweep keeps its stored runs"):
        run_sweep(sweep, out, progress=False, simulate=fake_simulate)
    (out / "points").unlink()
    # a folder of unrelated files only is a sweep's to write into, as an empty one
    (out / "summary.csv").unlink()
    (out / "latency_vs_throughput.png").unlink()
    run_sweep(sweep, out, progress=False, simulate=fake_simulate)
    assert (out / "sweep.json").exists() and (out / "notes.txt").read_text() == "kept\n"


def test_changed_base_config_reruns_stored_points(tmp_path):
    sweep = {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64, 256]}}
    out = tmp_path / "out"
    run_sweep(write_sweep(tmp_path, sweep), out, progress=False, simulate=fake_simulate)
    CALLS.clear()
    base = json.loads(json.dumps(BASE))
    base["workload"]["rate_scale"] = 2
    run_sweep(write_sweep(tmp_path, sweep, base=base), out, progress=False, simulate=fake_simulate)
    assert len(CALLS) == 2
    frame = read_csv(out / "summary.csv")
    assert list(frame["output_throughput"]) == [
        expected_throughput(n, 2, 0, s) for n, s in zip(frame["engine.max_num_seqs"], frame["seed"])
    ]


def test_failures_are_recorded_and_others_go_on(tmp_path):
    path = write_sweep(tmp_path, FULL_SWEEP)
    out = tmp_path / "out"
    result = run_sweep(path, out, progress=False, simulate=failing_simulate)
    assert result.exit_status == 1
    failed = read_csv(out / "failures.csv")
    assert list(failed.columns) == ["point_id", "replication", "seed", "variant", "swept", "overrides", "error"]
    assert all(f"engine.max_num_seqs=256, workload.rate_scale={rate}," in swept
               for rate, swept in zip(failed["overrides"].map(lambda o: json.loads(o)["workload.rate_scale"]),
                                      failed["swept"]))
    assert len(failed) == 3 * 2 * 2 == len(result.failures)  # 256 x 3 rates x 2 zip x eagle, 2 reps each
    assert set(failed["error"]) == {"ValueError: boom: verification overflow"}
    assert all(json.loads(o)["engine.max_num_seqs"] == 256 for o in failed["overrides"])
    assert set(failed["variant"]) == {"eagle"}
    frame = read_csv(out / "summary.csv")
    assert len(frame) == 48 - 12
    check_summary_against_fake(frame)
    CALLS.clear()
    fixed = run_sweep(path, out, progress=False, simulate=fake_simulate)
    assert fixed.exit_status == 0 and len(CALLS) == 12
    assert not (out / "failures.csv").exists()
    assert len(read_csv(out / "summary.csv")) == 48


def test_process_pool_matches_serial_bit_for_bit(tmp_path):
    path = write_sweep(tmp_path, FULL_SWEEP)
    run_sweep(path, tmp_path / "serial", progress=False, simulate=fake_simulate)
    run_sweep(path, tmp_path / "pool", jobs=2, progress=False, simulate=fake_simulate)
    for name in ("summary.csv", "speedup.csv"):
        assert (tmp_path / "pool" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()


def test_process_pool_records_failures(tmp_path):
    # in the sweep's order whatever order the workers finish in: failures.csv is the serial run's, byte for byte
    path = write_sweep(tmp_path, FULL_SWEEP)
    result = run_sweep(path, tmp_path / "pool", jobs=2, progress=False, simulate=failing_simulate)
    assert result.exit_status == 1 and len(result.failures) == 12
    run_sweep(path, tmp_path / "serial", progress=False, simulate=failing_simulate)
    assert (tmp_path / "pool" / "failures.csv").read_bytes() == (tmp_path / "serial" / "failures.csv").read_bytes()


@pytest.mark.skipif(not HAS_DASK, reason="dask.distributed is not installed (optional extra servesim[dask])")
def test_dask_local_cluster_matches_serial_bit_for_bit(tmp_path):
    import sys

    import cloudpickle

    path = write_sweep(tmp_path, FULL_SWEEP)
    run_sweep(path, tmp_path / "serial", progress=False, simulate=fake_simulate)
    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # workers need not import this test module
    try:
        run_sweep(path, tmp_path / "dask", jobs=2, executor="dask", progress=False, simulate=fake_simulate)
    finally:
        cloudpickle.unregister_pickle_by_value(module)
    for name in ("summary.csv", "speedup.csv"):
        assert (tmp_path / "dask" / name).read_bytes() == (tmp_path / "serial" / name).read_bytes()


def test_dask_missing_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "distributed", None)  # `import distributed` fails
    path = write_sweep(tmp_path, FULL_SWEEP)
    with pytest.raises(ConfigError, match=r"pip install servesim\[dask\]"):
        run_sweep(path, tmp_path / "out", executor="dask", progress=False, simulate=fake_simulate)


@pytest.mark.parametrize("spec", ["ray", "dask://", "dask://host", "dask://host:port"])
def test_unknown_executor_is_config_error(tmp_path, spec):
    path = write_sweep(tmp_path, FULL_SWEEP)
    with pytest.raises(ConfigError, match="--executor"):
        run_sweep(path, tmp_path / "out", executor=spec, progress=False, simulate=fake_simulate)


def test_zero_jobs_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--jobs"):
        run_sweep(write_sweep(tmp_path, FULL_SWEEP), tmp_path / "out", jobs=0, simulate=fake_simulate)


def test_caller_owned_executor_is_used_and_left_open(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    path = write_sweep(tmp_path, FULL_SWEEP)
    run_sweep(path, tmp_path / "serial", progress=False, simulate=fake_simulate)
    with ThreadPoolExecutor(max_workers=3) as pool:
        run_sweep(path, tmp_path / "threads", executor=pool, progress=False, simulate=fake_simulate)
        assert pool.submit(lambda: 1).result() == 1
    assert (tmp_path / "threads" / "summary.csv").read_bytes() == (tmp_path / "serial" / "summary.csv").read_bytes()


# --- speedup.csv -------------------------------------------------------------------------------------

EXAMPLE12_LIKE = {
    "base": "base.yaml",
    "grid": {"workload.concurrency": [1, 8, 64, 256]},
    "variants": {"plain": {}, "spec": {"speculative_config": {"method": "eagle", "num_speculative_tokens": 4}}},
    "baseline": "plain",
    "columns": {"workload.concurrency": "batch_size"},
    "replications": 3,
    "seed": 0,
}


def concurrency_simulate(config, *, seed=None, base_dir=None):
    """output_throughput = concurrency * (1 + k/2) * 100 tokens/s plus a seeded draw in [0, 1).

    A speculative run (k > 0) also reports vLLM's counters under ``spec_decode``, as the simulator's
    summary does (only for speculative runs).
    """
    k = (config.get("speculative_config") or {}).get("num_speculative_tokens", 0)
    noise = float(np.random.default_rng(seed).random())
    summary = {"output_throughput": config["workload"]["concurrency"] * (1 + k / 2) * 100.0 + noise}
    if k:
        summary["spec_decode"] = {"num_drafts": 10, "mean_acceptance_length": 1 + k / 2}
    return summary


def test_speedup_two_variants_uses_plain_spec_names_and_rename(tmp_path):
    path = write_sweep(tmp_path, EXAMPLE12_LIKE)
    result = run_sweep(path, tmp_path / "out", progress=False, simulate=concurrency_simulate)
    speedup = read_csv(tmp_path / "out" / "speedup.csv")
    assert list(speedup.columns) == ["batch_size", "plain_output_throughput", "spec_output_throughput", "speedup"]
    assert list(speedup["batch_size"]) == [1, 8, 64, 256]
    summary = read_csv(tmp_path / "out" / "summary.csv")
    assert list(summary.columns[:5]) == ["batch_size", "variant", "replication", "seed", "point_id"]
    for row in speedup.itertuples(index=False):
        rows = summary[summary["batch_size"] == row.batch_size]
        noise = {v: np.mean([np.random.default_rng(int(s)).random() for s in rows[rows["variant"] == v]["seed"]])
                 for v in ("plain", "spec")}
        plain = row.batch_size * 100.0 + noise["plain"]
        spec = row.batch_size * 300.0 + noise["spec"]
        assert row.plain_output_throughput == pytest.approx(plain, rel=1e-12)
        assert row.spec_output_throughput == pytest.approx(spec, rel=1e-12)
        assert row.speedup == pytest.approx(spec / plain, rel=1e-12)
    assert result.speedup is not None and len(result.speedup) == 4


def test_speedup_many_variants_uses_generic_names(tmp_path):
    sweep = dict(EXAMPLE12_LIKE)
    sweep["variants"] = {
        "plain": {},
        "k2": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
        "k4": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}},
    }
    sweep["columns"] = {}
    sweep["replications"] = 1
    run_sweep(write_sweep(tmp_path, sweep), tmp_path / "out", progress=False, simulate=concurrency_simulate)
    speedup = read_csv(tmp_path / "out" / "speedup.csv")
    assert list(speedup.columns) == [
        "workload.concurrency", "variant", "baseline_output_throughput", "variant_output_throughput", "speedup",
    ]
    assert list(speedup["variant"]) == ["k2", "k4"] * 4
    # closed form without noise: k2 doubles, k4 triples; the seeded draws move it by < 1 / (100 * concurrency)
    want = [2.0, 3.0] * 4
    tol = [1.0 / (100.0 * c) * 3 for c in speedup["workload.concurrency"]]
    assert all(abs(s - w) <= t for s, w, t in zip(speedup["speedup"], want, tol))


@pytest.mark.parametrize("variant_workload, want", [
    (None, "requests/s"),  # the base's poisson workload
    ({"type": "multi_turn"}, None),  # one variant's workload is multi-turn, the other's poisson: no one unit
])
def test_manifest_names_the_unit_of_each_swept_column(tmp_path, variant_workload, want):
    sweep = {"base": "base.yaml", "grid": {"workload.rate": [1.0, 2.0], "engine.max_num_seqs": [8]},
             "columns": {"workload.rate": "rate"}}
    if variant_workload:
        sweep["variants"] = {"a": {}, "b": {"workload.type": variant_workload["type"]}}
    loaded = load_sweep(write_sweep(tmp_path, sweep))
    units = {"rate": want, "engine.max_num_seqs": "requests"}
    assert loaded.column_units() == {column: unit for column, unit in units.items() if unit}
    multi_turn = dict(BASE, workload={"type": "multi_turn", "rate": 1.0, "num_sessions": 4})
    loaded = load_sweep(write_sweep(tmp_path / "sessions", sweep if not variant_workload else
                                    dict(sweep, variants={"a": {}}), base=multi_turn))
    assert loaded.column_units()["rate"] == "sessions/s"  # a multi-turn workload's rate is of sessions
    run_sweep(tmp_path / "sessions" / "sweep.yaml", tmp_path / "out", progress=False, simulate=fake_simulate)
    manifest = json.loads((tmp_path / "out" / "sweep.json").read_text(encoding="utf-8"))
    assert manifest["units"] == {"rate": "sessions/s", "engine.max_num_seqs": "requests"}


@pytest.mark.parametrize("variants", [
    # two routers (neither speculative): a ratio to the baseline, not a speculative speedup
    {"rr": {"deployment.routing": "round_robin"}, "jsq": {"deployment.routing": "least_loaded"}},
    # both speculative (k = 2 against k = 4): the baseline is not plain decoding either
    {"k2": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
     "k4": {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}},
])
def test_speedup_of_two_variants_that_are_not_plain_against_spec_uses_generic_names(tmp_path, variants):
    sweep = dict(EXAMPLE12_LIKE, variants=variants, baseline=next(iter(variants)), replications=1)
    run_sweep(write_sweep(tmp_path, sweep), tmp_path / "out", progress=False, simulate=concurrency_simulate)
    speedup = read_csv(tmp_path / "out" / "speedup.csv")
    assert list(speedup.columns) == [
        "batch_size", "variant", "baseline_output_throughput", "variant_output_throughput", "speedup",
    ]
    assert list(speedup["variant"]) == [list(variants)[1]] * 4


def test_speculative_comparison_is_read_from_the_runs_spec_decode_counters():
    summary = pd.DataFrame({"variant": ["plain", "eagle", "plain", "eagle"],
                            "spec_decode.num_drafts": [np.nan, 12, np.nan, 11]})
    assert tables.speculative_variants(summary) == {"eagle"}
    assert tables.is_speculative_comparison(summary, "plain")
    assert not tables.is_speculative_comparison(summary, "eagle")  # the baseline speculates
    assert not tables.is_speculative_comparison(summary, None)
    assert not tables.is_speculative_comparison(summary.drop(columns="spec_decode.num_drafts"), "plain")
    mixed = pd.concat([summary, pd.DataFrame({"variant": ["chunked"], "spec_decode.num_drafts": [np.nan]})])
    assert not tables.is_speculative_comparison(mixed, "plain")  # one compared variant does not speculate


def test_speedup_skips_settings_whose_baseline_failed(tmp_path):
    def_path = write_sweep(tmp_path, EXAMPLE12_LIKE)
    run_sweep(def_path, tmp_path / "out", progress=False, simulate=plain_fails_at_64)
    speedup = read_csv(tmp_path / "out" / "speedup.csv")
    assert list(speedup["batch_size"]) == [1, 8, 256]


def plain_fails_at_64(config, *, seed=None, base_dir=None):
    if config["workload"]["concurrency"] == 64 and "speculative_config" not in config:
        raise RuntimeError("no")
    return concurrency_simulate(config, seed=seed, base_dir=base_dir)


# --- the command -------------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_command_runs_and_returns_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(servesim, "simulate", fake_simulate, raising=False)
    path = write_sweep(tmp_path, FULL_SWEEP)
    args = parse([str(path), "--out", str(tmp_path / "out"), "--no-progress"])
    assert (args.jobs, args.executor) == (1, "local")
    assert command.run(args) == 0
    assert "48/48 runs finished" in capsys.readouterr().out
    assert (tmp_path / "out" / "summary.csv").exists() and (tmp_path / "out" / "speedup.csv").exists()


def test_command_exit_status_one_on_failure(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(servesim, "simulate", failing_simulate, raising=False)
    path = write_sweep(tmp_path, FULL_SWEEP)
    assert command.run(parse([str(path), "--out", str(tmp_path / "out"), "--no-progress", "--jobs", "2"])) == 1
    err = capsys.readouterr().err
    assert "12 run(s) failed" in err and "failures.csv" in err
    first = pd.read_csv(tmp_path / "out" / "failures.csv", dtype=str).iloc[0]
    # the first failure is named by its variant and its swept values (a variant's error alone did not say
    # whose, and the point's id alone not which values), with the id failures.csv lists it by
    swept = ("engine.max_num_seqs=256, workload.rate_scale=1, hardware='h100-sxm', "
             "engine.max_num_batched_tokens=8192")
    assert first["variant"] == "eagle" and first["swept"] == swept and first["replication"] == "0"
    assert (f"(first: variant 'eagle', point {swept} [{first['point_id']}], replication 0: "
            "ValueError: boom: verification overflow") in err


def test_cli_reports_bad_sweep_as_one_line(tmp_path, capsys):
    from servesim import cli

    path = tmp_path / "bad.yaml"
    path.write_text("base: base.yaml\ngrid: {engine.max_num_seqs: []}\n", encoding="utf-8")
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(BASE), encoding="utf-8")
    status = cli.main(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in err and err.startswith("servesim: error: ") and str(path) in err


# --- with the real simulator -------------------------------------------------------------------


def test_real_simulate_pool_matches_serial(tmp_path):
    base = json.loads(json.dumps(BASE))
    base["workload"]["num_requests"] = 30
    sweep = {"base": "base.yaml", "grid": {"engine.max_num_seqs": [16, 64]}, "replications": 2, "seed": 1}
    path = write_sweep(tmp_path, sweep, base=base)
    serial = run_sweep(path, tmp_path / "serial", progress=False)
    assert serial.exit_status == 0, serial.failures
    run_sweep(path, tmp_path / "pool", jobs=2, progress=False)
    assert (tmp_path / "pool" / "summary.csv").read_bytes() == (tmp_path / "serial" / "summary.csv").read_bytes()
    frame = read_csv(tmp_path / "serial" / "summary.csv")
    assert {"ttft_s.p99", "output_throughput", "completed"} <= set(frame.columns)
    assert (frame["completed"] == 30).all()
    # the two replications of a point use different seeds, so their arrivals (and TTFTs) differ
    assert frame.groupby("point_id")["ttft_s.mean"].nunique().eq(2).all()



def test_metric_names_cover_every_summary_key():
    """summary.csv's metric columns are a scalar summary key or ``group.part``: SCALAR_METRICS and
    GROUPED_METRICS, whose columns a swept key may not take, must list every key a run's summary can have
    (SLOs, speculation, prefix caching, a measurement window, replicas and their router), each with the
    right kind of value; a group's own name (example 12's ``batch_size`` axis) stays free."""
    from servesim import simulate
    from servesim.metrics.summary import GROUPED_METRICS, SCALAR_METRICS, is_metric_column
    from test_robustness_cli import SMALL

    spec = {"method": "eagle", "num_speculative_tokens": 2}
    cfg = {**SMALL, "slo": {"ttft_s": 0.5, "tpot_s": 0.05}, "speculative_config": spec,
           "simulation": {"measure": {"after_s": 0.0}}, "deployment": {"replicas": 2}}
    summary = simulate(cfg, seed=0).summary
    for key in ("goodput", "spec_decode", "prefix_cache", "measurement_window", "replicas", "router"):
        assert key in summary
    for key, value in summary.items():
        if key in SCALAR_METRICS:
            assert isinstance(value, (int, float)), key
        else:
            assert key in GROUPED_METRICS and isinstance(value, (dict, list)), key
    assert is_metric_column("ttft_s.p99") and is_metric_column("goodput") and not is_metric_column("batch_size")


def test_an_executor_that_cannot_start_leaves_no_sweep_behind(tmp_path, monkeypatch):
    """A Dask scheduler that could not be reached left points/ and sweep.json in --out."""
    import contextlib

    from servesim.sweep import runner

    @contextlib.contextmanager
    def unreachable(executor, jobs):
        raise ConfigError("--executor: cannot reach the Dask scheduler at dask://127.0.0.1:1")
        yield  # pragma: no cover

    monkeypatch.setattr(runner, "open_executor", unreachable)
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="cannot reach"):
        run_sweep(write_sweep(tmp_path, {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64]}}), out,
                  progress=False, simulate=fake_simulate, executor="dask://127.0.0.1:1")
    assert not (out / "sweep.json").exists() and not (out / "points").exists()


def test_a_sweep_given_in_python_resumes_a_file_sweeps_folder(tmp_path):
    """run_sweep(SweepConfig) into the folder of the same sweep run from its file was refused as another
    sweep (its source is 'sweep', not a file name)."""
    sweep = {"base": "base.yaml", "grid": {"engine.max_num_seqs": [64, 256]}}
    out = tmp_path / "out"
    run_sweep(write_sweep(tmp_path, sweep), out, progress=False, simulate=fake_simulate)
    CALLS.clear()
    import os

    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        again = run_sweep(SweepConfig.model_validate(sweep), out, progress=False, simulate=fake_simulate)
    finally:
        os.chdir(here)
    assert again.num_skipped == 2 and CALLS == []
