"""``servesim acceptance``: build acceptance profiles from data.

``servesim acceptance ngram --input PAIRS.jsonl --n N --k K [--min-n N] [--out PROFILE.yaml]`` replays
vLLM-style prompt lookup (:mod:`servesim.acceptance.ngram`) over ``{"prompt": ..., "answer": ...}`` lines
(text, split on whitespace, or lists of token ids), prints its statistics (to stderr when the profile
goes to stdout, so that ``> profile.yaml`` stays a valid profile) and writes an ``method: ngram``
profile that the engine reads (per-position rates over all rounds, no-match rounds counted as drafts with
nothing accepted, plus ``no_match_probability``).

From serving logs (:mod:`servesim.acceptance.logs` documents the arithmetic):

* ``servesim acceptance from-vllm-log --input server.log [--out PROFILE.yaml]``: pools vLLM's
  ``SpecDecoding metrics:`` lines (per-position rates weighted by drafts);
* ``servesim acceptance from-prometheus --input metrics.prom [--baseline before.prom]``: vLLM's
  ``vllm:spec_decode_*`` counters from a ``/metrics`` scrape (minus a scrape from before the run);
* ``servesim acceptance from-llamacpp --input responses.jsonl|server.log --k K``: llama.cpp's per-request
  ``timings`` (``draft_n``, ``draft_n_accepted``) or ``draft acceptance = ...`` log lines; only totals, so a
  constant conditional rate is fitted to the mean acceptance length at ``K``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from servesim.errors import ConfigError, TraceError
from servesim.json_objects import loads_line
from servesim.acceptance.ngram import NgramStats, aggregate
from servesim.speculation.profile import AcceptanceProfile

__all__ = ["add_arguments", "run", "read_pairs", "stats_to_profile"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``acceptance`` sub-commands to ``parser``."""
    sub = parser.add_subparsers(dest="acceptance_command", metavar="SOURCE")
    sub.required = True
    p = sub.add_parser("ngram", help="replay prompt-lookup drafting over (prompt, answer) pairs",
                       description="Replay vLLM's ngram proposer over JSONL (prompt, answer) pairs.")
    p.add_argument("--input", required=True, type=Path, help='JSONL file, one {"prompt": ..., "answer": ...} a line')
    p.add_argument("--n", type=int, default=5, help="prompt_lookup_max: longest n-gram to match (default 5)")
    p.add_argument("--min-n", type=int, default=None, help="prompt_lookup_min (default: same as --n)")
    p.add_argument("--k", type=int, required=True, help="num_speculative_tokens")
    p.add_argument("--match", choices=["most-recent", "earliest"], default="most-recent",
                   help="which earlier occurrence to copy from (default: most recent)")
    p.add_argument("--name", default=None, help="profile name (default: the output file stem)")
    p.add_argument("--out", type=Path, default=None, help="profile YAML to write (default: print it)")
    _add_log_subcommands(sub)


def _add_log_subcommands(sub: Any) -> None:
    """The ``from-vllm-log``, ``from-prometheus`` and ``from-llamacpp`` sub-commands."""
    from servesim.speculation.profile import SPEC_METHODS

    specs = [
        ("from-vllm-log", "pool vLLM's 'SpecDecoding metrics:' log lines into a profile", "vLLM server log"),
        ("from-prometheus", "turn vLLM's vllm:spec_decode_* Prometheus counters into a profile",
         "a /metrics scrape (Prometheus text format)"),
        ("from-llamacpp", "fit a profile to llama.cpp timings (draft_n, draft_n_accepted) or log lines",
         "JSONL of /completion responses, or a llama-server log"),
    ]
    for name, help_, input_help in specs:
        p = sub.add_parser(name, help=help_, description=help_ + ".")
        p.add_argument("--input", required=True, type=Path, help=input_help)
        if name == "from-prometheus":
            p.add_argument("--baseline", type=Path, default=None,
                           help="scrape taken before the run; its counters are subtracted")
        if name == "from-llamacpp":
            p.add_argument("--k", type=int, required=True,
                           help="draft length: llama.cpp's --spec-draft-n-max (its default is 3)")
        p.add_argument("--method", choices=SPEC_METHODS, default=None, help="vLLM method name for the profile")
        p.add_argument("--model", default=None, help="target model, recorded in the profile")
        p.add_argument("--dataset", default=None, help="workload/dataset, recorded in the profile")
        p.add_argument("--name", default=None, help="profile name (default: the output file stem)")
        p.add_argument("--out", type=Path, default=None, help="profile YAML to write (default: print it)")


def _run_from_logs(args: argparse.Namespace) -> int:
    from servesim.acceptance import logs

    if args.acceptance_command == "from-vllm-log":
        counts = logs.parse_vllm_log(args.input)
    elif args.acceptance_command == "from-prometheus":
        counts = logs.parse_prometheus(args.input, args.baseline)
    else:
        counts = logs.parse_llamacpp(args.input, args.k)
    name = args.name or (args.out.stem if args.out else args.input.stem)
    profile = counts.to_profile(name, method=args.method, model=args.model, dataset=args.dataset)
    _emit(_profile_yaml(profile), args.out, counts.summary_lines())
    return 0


def _emit(text: str, out: Path | None, statistics: list[str]) -> None:
    """Write the profile ``text`` to ``out``, or to stdout when ``out`` is None.

    The ``statistics`` lines go to stdout beside a written file, and to stderr when the profile itself
    goes to stdout, so that ``servesim acceptance ... > profile.yaml`` writes a valid profile.
    """
    if out is None:
        print("\n".join(statistics), file=sys.stderr)
        print(text, end="")
        return
    from servesim.atomic import write_text_output

    write_text_output(out, text)
    print("\n".join(statistics))
    print(f"wrote {out}")


def read_pairs(path: Path) -> list[tuple[list[Any], list[Any]]]:
    """Read ``(prompt, answer)`` token lists from a JSONL file.

    Raises:
        TraceError: missing file, not UTF-8, bad JSON, or a line without a string/list ``prompt`` and ``answer``.
    """
    from servesim.input_files import not_utf8_message

    try:
        lines = path.read_text(encoding="utf-8").removeprefix("\ufeff").splitlines()
    except UnicodeDecodeError as exc:
        raise TraceError(not_utf8_message(path, exc)) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read file ({exc.strerror})") from None
    pairs = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        row = loads_line(line, f"{path}: line {no}")
        if not isinstance(row, dict):
            raise TraceError(f"{path}: line {no}: expected an object with 'prompt' and 'answer'")
        toks = []
        for key in ("prompt", "answer"):
            val = row.get(key)
            if isinstance(val, str):
                toks.append(val.split())
            elif isinstance(val, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in val):
                toks.append(val)
            else:
                raise TraceError(f"{path}: line {no}: {key}: expected a string or a list of token ids")
        if not toks[1]:
            raise TraceError(f"{path}: line {no}: answer: expected at least one token")
        pairs.append((toks[0], toks[1]))
    if not pairs:
        raise TraceError(f"{path}: no (prompt, answer) lines found")
    return pairs


def stats_to_profile(stats: NgramStats, name: str, source: str, dataset: str | None,
                     max_n: int, min_n: int) -> AcceptanceProfile:
    """An ``ngram`` :class:`AcceptanceProfile` from replay counters (all-rounds convention)."""
    spread = ", ".join(f"{k} {v:.3f}" for k, v in stats.spread().items())
    notes = (
        f"prompt_lookup_min={min_n}, prompt_lookup_max={max_n}, num_speculative_tokens={stats.k}; "
        f"{stats.rounds} rounds, {stats.no_match_rounds} without a match, {stats.drafted_tokens} drafted, "
        f"{stats.accepted_tokens} accepted; per-position rates count no-match rounds as drafts with nothing "
        f"accepted; per-request mean accepted per round: {spread}"
    )
    return AcceptanceProfile(
        name=name, method="ngram", source=source, dataset=dataset, notes=notes,
        per_position_acceptance=[float(x) for x in stats.per_position],
        no_match_probability=stats.no_match_probability, rates_include_no_match=True,
    )


def _profile_yaml(profile: AcceptanceProfile) -> str:
    data = profile.model_dump(exclude_none=True, exclude_defaults=False)
    for key in ("illustrative", "rates_include_no_match"):
        data.setdefault(key, getattr(profile, key))
    return yaml.safe_dump(data, sort_keys=False, width=110)


def run(args: argparse.Namespace) -> int:
    """Run the chosen ``acceptance`` sub-command; returns the exit status."""
    if args.out is not None:
        from servesim.atomic import check_output_file, remove_earlier_output_file

        # before reading the input: an unwritable --out fails at once, an input is not replaced, and an
        # earlier profile of this command there is removed (a run that fails leaves none looking current;
        # any other file is left as it is)
        check_output_file(args.out, inputs=(("--input", args.input), ("--baseline", getattr(args, "baseline", None))))
        remove_earlier_output_file(args.out, "servesim acceptance")
    if args.acceptance_command in ("from-vllm-log", "from-prometheus", "from-llamacpp"):
        return _run_from_logs(args)
    if args.acceptance_command != "ngram":  # pragma: no cover - argparse restricts the choices
        raise ConfigError(f"acceptance: unknown source {args.acceptance_command!r}")
    min_n = args.n if args.min_n is None else args.min_n
    from servesim.speculation.config import MAX_SPEC_LEN

    if not 1 <= args.k <= MAX_SPEC_LEN:  # a longer profile is one no speculative_config can use
        raise ConfigError(f"--k: expected num_speculative_tokens from 1 to {MAX_SPEC_LEN}, the most servesim "
                          f"takes (got {args.k})")
    if not 1 <= min_n <= args.n:
        raise ConfigError(f"--min-n/--n: expected 1 <= prompt_lookup_min <= prompt_lookup_max (got {min_n}, {args.n})")
    pairs = read_pairs(args.input)
    prefer = "earliest" if args.match == "earliest" else "most_recent"
    stats = aggregate(pairs, args.k, args.n, min_n, prefer)
    name = args.name or (args.out.stem if args.out else f"ngram-{args.input.stem}-k{args.k}")
    profile = stats_to_profile(
        stats, name, source=f"servesim acceptance ngram --input {args.input.name}", dataset=args.input.name,
        max_n=args.n, min_n=min_n,
    )
    text = _profile_yaml(profile)
    rates = ", ".join(f"{x:.3f}" for x in stats.per_position)
    statistics = [
        f"requests: {len(pairs)}, rounds (target passes): {stats.rounds}, no match: "
        f"{stats.no_match_rounds} ({stats.no_match_probability:.1%})",
        f"drafted: {stats.drafted_tokens} tokens, accepted: {stats.accepted_tokens} tokens",
        f"per-position acceptance rate (all rounds): {rates}",
        f"mean acceptance length: {stats.mean_acceptance_length:.2f}",
        "per-request mean accepted per round: " + ", ".join(f"{k} {v:.2f}" for k, v in stats.spread().items()),
    ]
    _emit(text, args.out, statistics)
    return 0
