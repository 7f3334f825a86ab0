"""The package layout stays what docs/architecture.md describes: no import cycles, cited modules exist, and
``servesim run --no-plot`` imports only what a run needs (a structural check of ``sys.modules``, never a time)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "servesim"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages by their ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _runtime_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """servesim modules that ``path`` imports when it runs (module level or inside functions), leaving out
    ``if TYPE_CHECKING:`` blocks, which never run."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "servesim"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "servesim":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in modules else target)
    return {m for m in found if m in modules and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles_between_modules_or_packages():
    modules = _modules()
    graph = {name: _runtime_imports(name, path, modules) for name, path in modules.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
    # between sub-packages (servesim.config, servesim.workload, ...; the root package's lazy re-exports aside)
    packages: dict[str, set[str]] = {}
    for name, targets in graph.items():
        group = ".".join(name.split(".")[:2])
        for target in targets:
            other = ".".join(target.split(".")[:2])
            if other != group and other != "servesim":
                packages.setdefault(group, set()).add(other)
    assert _cycle(packages) is None, " -> ".join(_cycle(packages))


def test_the_cycle_check_sees_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def _top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                # a package that loads its names on first use (PEP 562) exports them through __all__
                names |= {e.value for e in getattr(node.value, "elts", ()) if isinstance(e, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _documents():
    yield ROOT / "README.md"
    for folder in ("docs", "hardware", "workloads", "experiments", "benchmarks", "oracle"):
        yield from (p for p in (ROOT / folder).rglob("*.md") if ".venv" not in p.parts)
    yield from PACKAGE.rglob("*.py")


def test_every_cited_module_path_exists():
    """``servesim/x/y.py`` paths and ``servesim.x.y.Name`` references in the docs and docstrings name
    modules (and top-level names of them) that exist, so a move cannot leave a stale citation."""
    modules = _modules()
    root_names = _top_level_names(PACKAGE / "__init__.py") | {"simulate", "Result", "SimConfig", "load_config",
                                                             "ServesimError"}
    stale = []
    for doc in _documents():
        text = doc.read_text(encoding="utf-8", errors="replace")
        for cited in set(re.findall(r"\bservesim/[\w/]*\w(?:\.py)?", text)):
            path = ROOT / cited
            if cited == "servesim/_shipped":  # a built package's copy of the data (servesim/shipped.py)
                continue
            if not (path.exists() or path.with_suffix(".py").exists()):
                stale.append(f"{doc.relative_to(ROOT)}: {cited}")
        for cited in set(re.findall(r"\bservesim(?:\.[A-Za-z_]\w*)+", text)):
            parts = cited.split(".")
            if parts[1] in root_names or parts[-1] in ("yaml", "json", "csv", "py", "md"):
                continue
            depth = max(i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in modules)
            if depth == len(parts):
                continue
            module = ".".join(parts[:depth])
            if depth == 1 or parts[depth] not in _top_level_names(modules[module]):
                stale.append(f"{doc.relative_to(ROOT)}: {cited}")
    assert not stale, "\n".join(sorted(stale))


#: imported by no run: plotting, statistics, the offline tools, the other commands' libraries
NOT_ON_THE_RUN_PATH = ("matplotlib", "pandas", "scipy", "dask", "distributed", "tqdm", "servesim.acceptance",
                       "servesim.analysis", "servesim.plots", "servesim.sweep", "servesim.cli.sweep",
                       "servesim.cli.plot", "servesim.cli.capacity", "servesim.cli.tune_k",
                       "servesim.cli.validate", "servesim.cli.calibrate", "servesim.cli.acceptance",
                       "servesim.cli.check_draft")


def _run_imports(tmp_path: Path, *extra: str) -> set[str]:
    """Modules loaded by ``servesim run`` of the Azure config (its first 50 requests) in a fresh process."""
    code = (
        "import json, sys\n"
        "from servesim.cli import main\n"
        f"status = main({json.dumps(['run', str(ROOT / 'experiments/azure-conv-llama8b-h100.yaml'), '--out', str(tmp_path), '--quiet', '--set', 'workload.max_requests=50', *extra])})\n"
        "print(json.dumps([status, sorted(sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    status, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == 0, done.stderr
    assert (tmp_path / "summary.json").is_file()
    return set(loaded)


def _loaded(prefix: str, modules: set[str]) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in modules)


@pytest.mark.parametrize("package", ["servesim.workload", "servesim.cards"])
def test_lazy_package_names_all_load(package):
    """``servesim.workload`` and ``servesim.cards`` load their names on first use: each one in ``__all__``
    resolves, and importing the package alone loads none of its submodules."""
    code = (f"import json, sys, {package} as w; before = sorted(m for m in sys.modules if m.startswith('{package}.'));"
            "missing = [n for n in w.__all__ if getattr(w, n, None) is None]; print(json.dumps([before, missing]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, missing = json.loads(done.stdout)
    assert before == [] and missing == []


def test_run_without_plot_imports_only_what_the_run_needs(tmp_path):
    loaded = _run_imports(tmp_path, "--no-plot")
    assert {"servesim.cli.run", "servesim.wiring", "servesim.engine.core", "numpy", "pydantic"} <= loaded
    assert [m for m in NOT_ON_THE_RUN_PATH if _loaded(m, loaded)] == []
    # the config has no speculative_config; the next test, with one, sees the same check find the package
    assert not _loaded("servesim.speculation", loaded)
    # an Azure trace replay loads neither the other trace parser nor the generators it does not use, and a
    # shipped model card needs no Hugging Face config.json reader
    unused = ("servesim.workload.mooncake", "servesim.workload.multi_turn", "servesim.workload.arrival_processes",
              "servesim.workload.content", "servesim.cards.hf_config")
    assert [m for m in unused if m in loaded] == []


def test_run_with_speculation_imports_the_runtime_model_only(tmp_path):
    loaded = _run_imports(tmp_path, "--no-plot", "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}')
    assert {"servesim.speculation.config", "servesim.speculation.profile", "servesim.engine.speculative_decoding"} <= loaded
    assert [m for m in NOT_ON_THE_RUN_PATH if _loaded(m, loaded)] == []



def test_a_run_config_builds_one_validator_for_its_workload():
    """The workload, length and system-prompt models are validated inside ``SimConfig`` only: loading a run
    config (and importing the workload builder, as a run does) builds no validator of their own
    (pydantic ``defer_build``), and the standalone workload-file model is built only when such a file is read."""
    code = ("import json; from servesim.config.models import load_config; import servesim.workload.build as b;"
            "from servesim.workload import config as c, lengths as l, system_prompts as s;"
            f"load_config({str(ROOT / 'experiments/azure-conv-llama8b-h100.yaml')!r});"
            "models = [b.WorkloadFile, c.TraceWorkloadConfig, c.PoissonWorkloadConfig, c.MultiTurnWorkloadConfig,"
            " l.UniformLengthConfig, l.EmpiricalPairsConfig, s.SystemPromptsConfig];"
            "print(json.dumps([m.__name__ for m in models if m.__pydantic_complete__]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
