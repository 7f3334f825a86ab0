"""The shipped data (servesim.shipped): a built package carries the clone's cards, acceptance profiles and
validation cases (setup.py's build_py), and reads its own copy before the source tree's."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim import shipped
from servesim.shipped import PACKAGE_COPY, SHIPPED_FOLDERS, shipped_dir

ROOT = Path(__file__).resolve().parents[1]


def _setup_constant(name: str):
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"setup.py defines no {name}")


def test_setup_py_copies_the_folders_the_package_reads() -> None:
    assert _setup_constant("SHIPPED_FOLDERS") == SHIPPED_FOLDERS
    assert _setup_constant("PACKAGE_COPY") == PACKAGE_COPY
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").split()
    for folder in SHIPPED_FOLDERS:  # an sdist carries them too, for the wheel built from it
        assert folder in manifest


def test_the_source_tree_is_read_without_a_package_copy() -> None:
    assert not (Path(shipped.__file__).parent / PACKAGE_COPY).exists()
    assert shipped_dir("hardware") == ROOT / "hardware"
    assert shipped_dir("workloads/acceptance") == ROOT / "workloads" / "acceptance"
    assert shipped_dir("experiments/validation") == ROOT / "experiments" / "validation"
    with pytest.raises(ValueError, match="'traces' is not a shipped folder"):
        shipped_dir("traces")


def test_a_built_package_finds_its_own_cards_profiles_and_cases(tmp_path: Path) -> None:
    build_lib = tmp_path / "lib"
    env = {**os.environ, "SERVESIM_PURE_PYTHON": "1"}
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(build_lib)], cwd=ROOT,
                   env=env, check=True, capture_output=True)
    copy = build_lib / "servesim" / PACKAGE_COPY
    for folder in SHIPPED_FOLDERS:
        source = sorted(p.relative_to(ROOT / folder) for p in (ROOT / folder).rglob("*") if p.is_file()
                        and "__pycache__" not in p.parts)
        assert sorted(p.relative_to(copy / folder) for p in (copy / folder).rglob("*") if p.is_file()) == source
    # the built package alone, from a folder that is not the clone: its copy is what it reads
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = ("from servesim.cards import load_hardware, cards_dirs; "
             "from servesim.speculation.profile import load_profile, profiles_dir; "
             "from servesim.analysis.validation import default_cases_dir; "
             "print(cards_dirs()[0]); print(profiles_dir()); print(default_cases_dir()); "
             "print(load_hardware('h100-sxm').name); "
             "print(load_profile('eagle-llama3.1-8b-sharegpt-k3', source='x').name)")
    env = {k: v for k, v in env.items() if k != "SERVESIM_CARDS_PATH"}
    env["PYTHONPATH"] = str(build_lib)
    out = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, check=True,
                         capture_output=True, text=True).stdout.splitlines()
    assert out[:3] == [str(copy / "hardware"), str(copy / "workloads" / "acceptance"),
                       str(copy / "experiments" / "validation")]
    assert out[3].lower().startswith("h100")
    assert out[4] == "eagle-llama3.1-8b-sharegpt-k3"
