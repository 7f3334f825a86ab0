"""``servesim validate [CASES...] [--fast] [--out DIR]``: compare predictions with published measurements.

Runs the validation cases (default: every file in ``experiments/validation/``), prints a table (case,
source, measured, simulated, relative error, within tolerance) and writes ``DIR/validation.csv`` and
``DIR/validation.png``. Exits 0 even when cases fall outside their tolerance (the report names them and
their notes), unless ``--strict`` is given: then it exits 1 when any case is outside; a bad case file is a one-line error (exit 2 from the front end).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servesim.cli import COMMAND_OUTPUTS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``validate`` options to ``parser``."""
    parser.add_argument("cases", nargs="*", metavar="CASES",
                        help="case files or folders (default: experiments/validation/)")
    parser.add_argument("--fast", action="store_true", help="run only the cases marked fast: true")
    parser.add_argument("--out", default="out/validation", help="output folder (default: out/validation)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--vllm-bench", action="append", default=[], metavar="RESULT.json",
                        help="a `vllm bench serve --save-result` JSON to replay as a case (repeatable; needs --server)")
    parser.add_argument("--server", metavar="CONFIG.yaml",
                        help="the server's settings for --vllm-bench: a run config (its workload is replaced)")
    parser.add_argument("--tolerance", type=float, default=None,
                        help="tolerance of the --vllm-bench cases (fraction, default 0.10)")
    parser.add_argument("--strict", action="store_true",
                        help="exit with status 1 when any case is outside its tolerance (default: report only)")


#: Relative tolerance of a ``--vllm-bench`` case without ``--tolerance`` (fraction).
DEFAULT_BENCH_TOLERANCE = 0.10

#: Files ``servesim validate`` writes into ``--out``.
VALIDATE_OUTPUTS = COMMAND_OUTPUTS["validate"]


def bench_case_names(results: list[str]) -> list[str]:
    """The case names of ``--vllm-bench`` result files: each file's stem (``runs/r.json`` -> ``r``), or,
    where two files share a stem, the path as given without its suffix (``a/r``, ``b/r``), so that every
    row of the report says which file it compares.

    Raises:
        ConfigError: the same file given twice.
    """
    from servesim.errors import ConfigError

    seen: dict[Path, str] = {}
    for result in results:
        resolved = Path(result).resolve()
        if resolved in seen:
            raise ConfigError(f"validate: --vllm-bench: {result} given twice (as {seen[resolved]}; expected each "
                              "result file once)")
        seen[resolved] = result
    stems = [Path(result).stem for result in results]
    return [stem if stems.count(stem) == 1 else Path(result).with_suffix("").as_posix()
            for result, stem in zip(results, stems)]


def run(args: argparse.Namespace) -> int:
    """Run the cases, print the report, write the CSV and PNG; returns 0, or 1 with ``--strict`` when a case
    is outside its tolerance (errors raise ServesimError)."""
    from servesim.analysis.validation import format_table, load_cases, plot, run_cases, write_csv
    from servesim.atomic import prepare_output_dir, replacing_outputs
    from servesim.errors import ConfigError

    bench = list(getattr(args, "vllm_bench", []) or [])
    if args.server and not bench:  # otherwise ignored: the published cases would run as if it were used
        raise ConfigError("validate: --server is the server of --vllm-bench RESULT.json: give both, or neither")
    if args.tolerance is not None and not bench:  # the published cases carry their own tolerances
        raise ConfigError("validate: --tolerance applies to --vllm-bench cases only (the published cases carry "
                          "their own): give it with --vllm-bench, or leave it out")
    tolerance = DEFAULT_BENCH_TOLERANCE if args.tolerance is None else args.tolerance
    cases = load_cases(list(args.cases), fast_only=args.fast) if args.cases or not bench else []
    if bench:
        from servesim.analysis.bench_replay import BenchCase
        from servesim.analysis.validation import LoadedCase

        if not args.server:
            raise ConfigError("validate: --vllm-bench needs --server CONFIG.yaml (the server's settings)")
        if not 0 < tolerance < 1:
            raise ConfigError(f"validate: --tolerance: expected a fraction in (0, 1) (got {tolerance})")
        for i, (result, name) in enumerate(zip(bench, bench_case_names(bench))):
            case = BenchCase(name=name, bench_result=str(Path(result).resolve()),
                             config=str(Path(args.server).resolve()), tolerance=tolerance)
            cases.append(LoadedCase(case=case, file=Path.cwd() / "--vllm-bench", index=i, key="vllm_bench"))
    if not cases:
        raise ConfigError("validate: no cases to run (none marked fast: true?)")
    out = prepare_output_dir(args.out)  # before the simulations: an unwritable --out fails at once
    # a failed or interrupted rerun must not leave the earlier validation.csv/png looking current, nor a CSV
    # without its figure
    with replacing_outputs(out, VALIDATE_OUTPUTS):
        results = run_cases(cases, progress=lambda name: print(f"running {name}", file=sys.stderr))
        csv_path = write_csv(results, out / "validation.csv")
        png_path = plot(results, out / "validation.png")
    print(format_table(results, markdown=args.markdown))
    inside = sum(r.within for r in results)
    print(f"\n{inside} of {len(results)} cases within tolerance.")
    outside = [r for r in results if not r.within]
    if outside:
        print("Outside tolerance:")
        print("\n".join(outside_lines(outside)))
    print(f"wrote {csv_path} and {png_path}")
    return 1 if outside and getattr(args, "strict", False) else 0


def outside_lines(outside: list) -> list[str]:
    """One line per case outside its tolerance: ``  NAME: [detail] notes``, a case's notes written once (a
    later case with the same notes refers to the first that gave them: the gpt-oss cases share one long
    note)."""
    lines, first_with = [], {}
    for r in outside:
        parts = [f"[{r.detail}]"] if r.detail else []
        if r.notes and r.notes in first_with:
            parts.append(f"(notes as for {first_with[r.notes]})")
        elif r.notes:
            first_with[r.notes] = r.name
            parts.append(r.notes)
        lines.append(f"  {r.name}" + (": " + " ".join(parts) if parts else ""))
    return lines
