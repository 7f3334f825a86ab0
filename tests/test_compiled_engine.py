"""The optional Cython build (setup.py, servesim.compiled): compiled modules give the interpreted ones'
results bit for bit, and a module whose source changed since the build runs from its source.

The equality test needs a compiled install; on a pure-Python one (no Cython or C compiler at build time)
it is skipped, unless ``$SERVESIM_REQUIRE_COMPILED`` is set (``.ci/run`` sets it: CI builds the compiled
engine and must test it).
"""

from __future__ import annotations

import hashlib
import os
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


def test_a_source_with_the_build_s_size_and_mtime_is_not_read(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # the guard's shortcut (as a .pyc's timestamp check): size and mtime as recorded -> unchanged, unread
    source = tmp_path / "module.py"
    source.write_text("x = 1\n")
    stat = source.stat()
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    same = {"sha256": "0" * 64, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    assert not compiled.source_changed(source, stat, same)  # a wrong hash, never computed
    # another mtime (touched, or edited): the hash decides
    touched = {"sha256": digest, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns - 1}
    assert not compiled.source_changed(source, stat, touched)
    assert compiled.source_changed(source, stat, dict(touched, sha256="0" * 64))
    assert compiled.source_changed(source, stat, dict(same, size=stat.st_size + 1))  # another size: hashed
    assert not compiled.source_changed(source, stat, digest)  # an earlier build's record: the hash alone
    assert compiled.source_changed(source, stat, "0" * 64)
    # the finder reads the package's sources the same way
    monkeypatch.delenv(compiled.PURE_PYTHON_VAR, raising=False)
    heap = ROOT / "servesim" / "heap.py"
    heap_stat = heap.stat()
    record = {"sha256": "0" * 64, "size": heap_stat.st_size, "mtime_ns": heap_stat.st_mtime_ns}
    assert compiled.SourceWhenStale({"servesim.heap": record}).find_spec("servesim.heap") is None
    record["mtime_ns"] += 1
    assert compiled.SourceWhenStale({"servesim.heap": record}).find_spec("servesim.heap") is not None


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



def test_setup_py_builds_what_the_package_reads() -> None:
    # setup.py does not import the package it builds: its names are checked against servesim.compiled's
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    constants = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)}
    assert ast.literal_eval(constants["MANIFEST"]) == compiled.MANIFEST.name
    modules = ast.literal_eval(constants["COMPILED"])
    assert modules and all((ROOT / Path(*name.split("."))).with_suffix(".py").is_file() for name in modules)
    # the same variable and rule as compiled.pure_python_requested: set and not "0"
    source = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert f'os.environ.get("{compiled.PURE_PYTHON_VAR}", "") not in ("", "0")' in source


_STEP_TIMES = """
import json
from servesim.cards import load_hardware, load_model
from servesim.roofline import build_step_time_model
from servesim.speculation.costs import build_drafter
from servesim.speculation.config import SpeculativeConfig
import servesim.roofline as roofline
out = {"compiled": not roofline.__file__.endswith(".py")}
for gpu, model, tp in [("h100-sxm", "llama-3.1-8b", 1), ("a100-80gb-sxm", "llama-3.1-70b", 4),
                       ("h200-sxm", "mixtral-8x7b", 2), ("h100-sxm", "deepseek-v3", 8), ("l40s", "qwen3-8b", 2),
                       ("mi300x", "gpt-oss-120b", 1)]:
    hw, card = load_hardware(gpu), load_model(model)
    for mode in ("calibrated", "ideal"):
        st = build_step_time_model(hw, card, tp, mode=mode, speculative=True)
        rows = [st.step_subps(t, l, 5000 * t, 77 * t, r) for t, l, r in
                [(1, 1, 1), (7, 7, 7), (64, 64, 64), (512, 3, 2), (2048, 16, 16), (8192, 1, 1), (100, 400, 100)]]
        rows += [repr(st.context_free_s(t, t)) for t in (1, 3, 33, 257, 4096)]
        drafter = build_drafter(SpeculativeConfig(method="eagle", num_speculative_tokens=3), hw, card, tp, mode, st)
        rows += [drafter.step_subps(t, r, 3, 900 * r) for t, r in [(4, 1), (64, 16), (1000, 250)]]
        out[f"{gpu} {model} tp{tp} {mode}"] = rows
print(json.dumps(out))
"""


def test_compiled_step_times_equal_the_interpreted_ones_bit_for_bit() -> None:
    # the roofline and drafter modules are compiled too (setup.py): dense, MoE, tensor-parallel and sliding
    # window cards on several GPUs, both modes, give the same integers and float reprs either way
    if "servesim.roofline" not in compiled.built_modules():
        if os.environ.get("SERVESIM_REQUIRE_COMPILED"):
            pytest.fail("servesim.roofline was not compiled: the Cython build did not run")
        pytest.skip("a pure-Python install: nothing to compare")
    results = []
    for pure in (False, True):
        env = {key: value for key, value in os.environ.items() if key != compiled.PURE_PYTHON_VAR}
        if pure:
            env[compiled.PURE_PYTHON_VAR] = "1"
        proc = subprocess.run([sys.executable, "-c", _STEP_TIMES], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        results.append(__import__("json").loads(proc.stdout))
    assert results[0].pop("compiled") is True and results[1].pop("compiled") is False
    assert results[0] == results[1]


def test_the_extension_types_have_one_field_per_slot() -> None:
    # setup.py's EXTENSION_TYPES: compiled, each class is an extension type whose attributes are exactly its
    # source's __slots__ (getset descriptors of its struct's fields); interpreted, the same slots (members)
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    types = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "EXTENSION_TYPES" for t in node.targets))
    assert set(types) <= set(compiled.built_modules()) or not compiled.built_modules()
    code = ("import importlib, json, sys; types = json.loads(sys.argv[1]); out = {}\n"
            "for module, classes in types.items():\n"
            "    mod = importlib.import_module(module)\n"
            "    for name in classes:\n"
            "        cls = getattr(mod, name)\n"
            "        out[name] = [list(cls.__slots__), sorted({type(cls.__dict__[s]).__name__ for s in cls.__slots__\n"
            "                                                 if s != '__weakref__'})]\n"
            "print(json.dumps(out))")
    expected = {"getset_descriptor"} if compiled.built_modules() else {"member_descriptor"}
    for pure, kinds in ((False, expected), (True, {"member_descriptor"})):
        env = {key: value for key, value in os.environ.items() if key != compiled.PURE_PYTHON_VAR}
        if pure:
            env[compiled.PURE_PYTHON_VAR] = "1"
        import json

        proc = subprocess.run([sys.executable, "-c", code, json.dumps(types)], capture_output=True, text=True,
                              env=env)
        assert proc.returncode == 0, proc.stderr
        found = json.loads(proc.stdout)
        assert sorted(found) == sorted(name for classes in types.values() for name in classes)
        for name, (slots, descriptor_kinds) in found.items():
            assert slots, name
            assert set(descriptor_kinds) == kinds, (name, pure, descriptor_kinds)


def test_setup_py_reads_a_class_s_slots_as_python_does(tmp_path: Path) -> None:
    # setup.py's _slots_of (run at build time, without the package): the last __slots__ assignment, one
    # string as one slot; a computed or non-string __slots__ is refused, naming the file and the class
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    function = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "_slots_of")
    namespace: dict = {"Path": Path}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "setup.py", "exec"), namespace)
    slots_of = namespace["_slots_of"]

    def source(value: str) -> Path:
        path = tmp_path / "module.py"
        path.write_text(f"class Probe:\n    __slots__ = ('first',)\n    __slots__ = {value}\n")
        return path

    assert slots_of(source('("a", "b")'), "Probe") == ["a", "b"]
    assert slots_of(source('"value"'), "Probe") == ["value"]
    assert slots_of(source('["a"]'), "Probe") == ["a"]
    for value, detail in (('("a",) + ("b",)', " (its __slots__ is computed)"), ("NAMES", " (its __slots__ is computed)"),
                          ("(1, 2)", "")):
        with pytest.raises(ValueError) as error:
            slots_of(source(value), "Probe")
        assert str(error.value) == (f"{tmp_path / 'module.py'}: class Probe (setup.py EXTENSION_TYPES) needs "
                                    f"__slots__ as a literal tuple of attribute names{detail}")
    with pytest.raises(ValueError, match="class Other .* needs __slots__"):
        slots_of(source('("a",)'), "Other")
