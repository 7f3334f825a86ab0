#!/usr/bin/env python3
"""Hand-picked mutation testing of servesim's simulation core (docs/mutation-testing.md).

Applies one mutation of ``tools/mutants.py`` at a time to a source file of this checkout, runs the test
files of the mutant's group (``pytest -x``: it stops at the first failure), records ``killed`` (a test
failed), ``survived`` (all passed) or ``timeout`` (the run hung: killed too), and writes the file's
original bytes back before the next mutant, whatever happened (and checks ``git diff`` is clean for it).

Usage (from the repository root, in the project's virtual environment)::

    python tools/mutation_check.py                     # every mutant, its group's tests
    python tools/mutation_check.py R03 K04             # the mutants whose id starts with these
    python tools/mutation_check.py --full C20          # the whole suite (for a survivor)
    python tools/mutation_check.py --out results.jsonl # also append one JSON line per mutant

Never run two of these at once in one checkout, nor other tests of it meanwhile: the mutant is live in
the working tree while its tests run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from mutants import GROUPS, MUTANTS  # noqa: E402


def run_mutant(mutant_id: str, rel: str, old: str, new: str, tests: list[str], timeout_s: int) -> dict:
    path = ROOT / rel
    original = path.read_bytes()
    text = original.decode("utf-8")
    if text.count(old) != 1:
        return {"id": mutant_id, "file": rel, "status": f"skipped ({text.count(old)} matches)"}
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    start = time.monotonic()
    try:
        path.write_text(text.replace(old, new), encoding="utf-8")
        proc = subprocess.run(["timeout", str(timeout_s), sys.executable, "-m", "pytest", "-q", "-x",
                               "-p", "no:cacheprovider", *tests], cwd=ROOT, env=env, capture_output=True,
                              text=True)
    finally:
        path.write_bytes(original)
    if subprocess.run(["git", "diff", "--quiet", "--", rel], cwd=ROOT).returncode != 0:
        raise SystemExit(f"{rel}: not restored to its committed state; stop and check it")
    failed = [line.split(" ")[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    status = {0: "survived", 124: "timeout"}.get(proc.returncode, "killed")
    return {"id": mutant_id, "file": rel, "status": status, "by": failed[:1],
            "wall_s": round(time.monotonic() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="mutant id prefixes (default: all)")
    parser.add_argument("--full", action="store_true", help="run the whole suite instead of the group")
    parser.add_argument("--out", type=Path, help="append one JSON line per mutant to this file")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per mutant (default 300)")
    args = parser.parse_args()
    for mutant_id, rel, old, new, group in MUTANTS:
        if args.ids and not any(mutant_id.startswith(prefix) for prefix in args.ids):
            continue
        tests = ["tests"] if args.full else GROUPS[group]
        record = run_mutant(mutant_id, rel, old, new, tests, 2 * args.timeout if args.full else args.timeout)
        print(json.dumps(record), flush=True)
        if args.out:
            with args.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
