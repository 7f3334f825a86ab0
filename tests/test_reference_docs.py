"""The reference facts the code cites live in the repository (docs/reference/), and nothing points outside it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
#: folders of the repository whose text files are checked (code, cards, profiles, docs, experiments, tests)
CHECKED = ("servesim", "hardware", "workloads", "experiments", "benchmarks", "docs", "tests", ".ci")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".json", ".txt", ".toml", ".csv", ""}
#: a citation of the project's workspace instead of the repository's own copy
OUTSIDE = re.compile(r"/work/|\.\./shared|shared[-/]data|shared/seed|shared/design")


def checked_files():
    yield ROOT / "README.md"
    yield ROOT / "pyproject.toml"
    for folder in CHECKED:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "traces" not in path.parts \
                    and path.stat().st_size < 1_000_000:
                yield path


def test_no_file_cites_the_workspace_outside_the_repository():
    offenders = []
    for path in checked_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_reference_copies_are_listed_with_their_checksums():
    readme = (REFERENCE / "README.md").read_text(encoding="utf-8")
    listed = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, re.M))
    files = {p.name for p in REFERENCE.iterdir() if p.is_file() and p.name != "README.md"}
    assert files <= set(listed), files - set(listed)
    for name, digest in listed.items():
        assert hashlib.sha256((REFERENCE / name).read_bytes()).hexdigest() == digest, name
        assert f"[{name}]({name})" in readme, f"{name} has no row in docs/reference/README.md"


def test_every_cited_reference_file_exists():
    cited = set()
    for path in checked_files():
        cited |= set(re.findall(r"docs/reference/([\w./-]+\.(?:md|csv|txt))",
                                path.read_text(encoding="utf-8", errors="replace")))
    assert cited, "nothing cites docs/reference/"
    missing = sorted(name for name in cited if not (REFERENCE / name).is_file())
    assert not missing, missing
