"""The optional Cython build (setup.py, servesim.compiled): compiled modules give the interpreted ones'
results bit for bit, and a module whose source changed since the build runs from its source.

The equality test needs a compiled install; on a pure-Python one (no Cython or C compiler at build time)
it is skipped, unless ``$SERVESIM_REQUIRE_COMPILED`` is set (``.ci/run`` sets it: CI builds the compiled
engine and must test it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servesim import compiled

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "experiments" / "azure-conv-llama8b-h100.yaml"
EAGLE = '{"method": "eagle", "num_speculative_tokens": 3, "acceptance": "eagle-llama3.1-8b-sharegpt-k3"}'
RUNS = {
    # full KV cache, preemptions, chunked prefill
    "plain-4x": [str(AZURE), "--set", "workload.rate_scale=4", "--set", "workload.max_requests=2500"],
    "eagle-4x-async": [str(AZURE), "--set", "workload.rate_scale=4", "--set", "workload.max_requests=1500",
                       "--set", "engine.async_scheduling=true", "--speculative-config", EAGLE],
    "prefix-caching": [str(ROOT / "experiments" / "prefix-caching" / "mooncake-conv-llama8b-h100.yaml"),
                       "--set", "workload.max_requests=1500"],
}


def _run(args: list[str], out: Path, pure: bool) -> dict[str, bytes]:
    env = {key: value for key, value in os.environ.items() if key != compiled.PURE_PYTHON_VAR}
    if pure:
        env[compiled.PURE_PYTHON_VAR] = "1"
    code = ("import sys; from servesim.cli import main; from servesim.compiled import compiled_modules; "
            "code = main(); print('COMPILED', sorted(n for n, c in compiled_modules().items() if c)); "
            "sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", code, "run", *args, "--out", str(out), "--no-plot", "--quiet"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    files = {name: (out / name).read_bytes() for name in ("summary.json", "requests.csv", "steps.csv")}
    files["compiled"] = proc.stdout.strip().encode()
    return files


@pytest.mark.parametrize("name", sorted(RUNS))
def test_compiled_engine_equals_the_interpreted_one_bit_for_bit(name: str, tmp_path: Path) -> None:
    if not compiled.built_modules():
        if os.environ.get("SERVESIM_REQUIRE_COMPILED"):
            pytest.fail("no compiled modules (the package's _compiled.json): the Cython build did not run")
        pytest.skip("a pure-Python install (no Cython or C compiler when it was built): nothing to compare")
    fast = _run(RUNS[name], tmp_path / "compiled", pure=False)
    slow = _run(RUNS[name], tmp_path / "pure", pure=True)
    assert fast.pop("compiled") == f"COMPILED {sorted(compiled.built_modules())}".encode()
    assert slow.pop("compiled") == b"COMPILED []"
    for file in fast:
        assert fast[file] == slow[file], f"{name}: {file} differs between compiled and interpreted modules"


def test_a_changed_source_is_imported_from_its_py_file(monkeypatch: pytest.MonkeyPatch) -> None:
    source = ROOT / "servesim" / "heap.py"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    monkeypatch.delenv(compiled.PURE_PYTHON_VAR, raising=False)
    # the recorded hash matches: left to the usual finders (the compiled file where there is one)
    assert compiled.SourceWhenStale({"servesim.heap": digest}).find_spec("servesim.heap") is None
    # the source changed since the build: its .py file
    spec = compiled.SourceWhenStale({"servesim.heap": "0" * 64}).find_spec("servesim.heap")
    assert spec is not None and Path(spec.origin) == source
    # $SERVESIM_PURE_PYTHON: the .py file, whatever the hash ("0" means unset)
    monkeypatch.setenv(compiled.PURE_PYTHON_VAR, "1")
    spec = compiled.SourceWhenStale({"servesim.heap": digest}).find_spec("servesim.heap")
    assert spec is not None and Path(spec.origin) == source
    monkeypatch.setenv(compiled.PURE_PYTHON_VAR, "0")
    assert compiled.SourceWhenStale({"servesim.heap": digest}).find_spec("servesim.heap") is None
    # modules the build did not compile are not its business
    assert compiled.SourceWhenStale({"servesim.heap": "0" * 64}).find_spec("servesim.roofline") is None


def test_an_edited_compiled_module_runs_as_written() -> None:
    # the guard is installed by `import servesim`: a changed hash makes the child import heap.py itself
    recorded = compiled.built_modules()
    if "servesim.heap" not in recorded:
        if os.environ.get("SERVESIM_REQUIRE_COMPILED"):
            pytest.fail("servesim.heap was not compiled: the Cython build did not run")
        pytest.skip("a pure-Python install: no compiled module to shadow an edit")
    code = ("import sys; import servesim.compiled as c; "
            "[f for f in sys.meta_path if isinstance(f, c.SourceWhenStale)][0].recorded = {'servesim.heap': '0' * 64}; "
            "import servesim.heap as h; print(h.__file__)")
    env = {key: value for key, value in os.environ.items() if key != compiled.PURE_PYTHON_VAR}  # (the suite may
    # run interpreted: these children must not)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("heap.py")
    plain = subprocess.run([sys.executable, "-c", "import servesim.heap as h; print(h.__file__)"],
                           capture_output=True, text=True, env=env)
    assert not plain.stdout.strip().endswith(".py"), plain.stdout


def test_the_digest_covers_a_module_and_its_declarations(tmp_path: Path) -> None:
    heap = ROOT / "servesim" / "heap.py"  # no .pxd: the .py's SHA-256
    assert compiled.source_digest(heap) == hashlib.sha256(heap.read_bytes()).hexdigest()
    core = ROOT / "servesim" / "engine" / "core.py"
    assert compiled.source_digest(core) == hashlib.sha256(core.read_bytes() + core.with_suffix(".pxd").read_bytes()
                                                          ).hexdigest()
    module = tmp_path / "module.py"
    module.write_text("x = 1\n")
    alone = compiled.source_digest(module)
    module.with_suffix(".pxd").write_text("cdef class A:\n    cdef public object x\n")
    declared = compiled.source_digest(module)
    module.with_suffix(".pxd").write_text("cdef class A:\n    cdef public object y\n")
    assert len({alone, declared, compiled.source_digest(module)}) == 3  # an edited .pxd is a stale build


# the classes the .pxd files declare, and configs that between them set every attribute of each
DECLARED = {"Engine": "core", "PlainDecoding": "plain_decoding", "SpeculativeDecoding": "speculative_decoding",
            "BlockManager": "block_manager"}
ATTRIBUTES_CODE = """
import json, sys
import numpy as np
from servesim.cli.run import parse_overrides
from servesim.config.models import load_config
from servesim.wiring import build_engine
seen = {}
for path, sets, spec in json.loads(sys.argv[1]):
    cfg, folder = load_config(path, parse_overrides(sets, spec, None), set_keys=[s.split("=")[0] for s in sets])
    engine, env, _ = build_engine(cfg, folder, np.random.SeedSequence(0))
    env.run()
    for obj in (engine, engine.decoding, engine.kv):
        seen.setdefault(type(obj).__name__, set()).update(vars(obj))
print(json.dumps({name: sorted(names) for name, names in seen.items()}))
"""


def test_each_declaration_file_lists_the_attributes_its_class_sets() -> None:
    # interpreted, vars() holds every attribute an object has; a .pxd that missed one would leave it in the
    # compiled object's __dict__ (slow), one that named a gone attribute would hold a dead field
    configs = [[str(AZURE), ["workload.max_requests=200"], None],
               [str(AZURE), ["workload.max_requests=200", "engine.async_scheduling=true"], EAGLE],
               [RUNS["prefix-caching"][0], ["workload.max_requests=200"], None]]
    env = dict(os.environ, **{compiled.PURE_PYTHON_VAR: "1"})
    proc = subprocess.run([sys.executable, "-c", ATTRIBUTES_CODE, json.dumps(configs)], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert set(seen) == set(DECLARED)
    for name, module in DECLARED.items():
        text = (ROOT / "servesim" / "engine" / f"{module}.pxd").read_text(encoding="utf-8")
        declared = re.findall(r"^    cdef public object (\w+)$", text, flags=re.MULTILINE)
        # any other attribute and weak references work as on a Python object
        assert f"\ncdef class {name}:\n    cdef dict __dict__\n    cdef object __weakref__\n" in text
        assert declared == sorted(declared) and set(declared) == set(seen[name]), name
        # no C type anywhere: every declaration is a Python object (the interpreted semantics)
        fields = [line for line in text.splitlines() if line.startswith("    cdef ")]
        assert all(line.startswith(("    cdef public object ", "    cdef dict __dict__", "    cdef object __weakref__"))
                   for line in fields), name
