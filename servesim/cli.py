"""The ``servesim`` command line: a thin argparse front end over the Python API.

Each sub-command lives in its own module that exposes ``add_arguments(parser)`` and ``run(args) -> int``;
this file only wires them up, imports the one that is used (start-up time matters: ``servesim run``
must finish a whole trace in about a second), and turns :class:`~servesim.errors.ServesimError`
into one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("servesim.commands.run", "simulate one config and write summary.json, requests.csv, steps.csv"),
    "sweep": ("servesim.sweep.command", "run a grid of configs (resumable) and write summary.csv"),
    "plot": ("servesim.plots.command", "plot the results of a sweep directory"),
    "capacity": ("servesim.analysis.capacity_command", "find the highest rate (or fewest replicas) meeting an SLO"),
    "tune-k": ("servesim.analysis.tune_k_command", "derive num_speculative_tokens_per_batch_size"),
    "validate": ("servesim.analysis.validate_command", "compare predictions with published measurements"),
    "calibrate": ("servesim.analysis.calibrate_command", "fit a hardware card to measured step times"),
    "acceptance": ("servesim.speculation.acceptance_command", "build acceptance profiles from text or logs"),
    "check-draft": ("servesim.speculation.vocab_command", "check draft/target vocabulary compatibility"),
}


def _available() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (module, help_) in COMMANDS.items():
        if importlib.util.find_spec(module.rsplit(".", 1)[0]) is None:
            continue
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:
            continue
        found[name] = (module, help_)
    return found


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = argparse.ArgumentParser(
        prog="servesim",
        description="Simulate an LLM inference server (vLLM-style) and report TTFT, TPOT, ITL, throughput.",
    )
    from servesim import __version__

    parser.add_argument("--version", action="version", version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    modules: dict[str, object] = {}
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_)
        if wanted is None or wanted == name:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            modules[name] = module
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``servesim`` console script; returns the exit status."""
    from servesim.errors import ServesimError

    if argv is None:
        argv = sys.argv[1:]
    parser, modules = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        return int(modules[args.command].run(args) or 0)
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    except (FileExistsError, NotADirectoryError, IsADirectoryError, PermissionError) as exc:
        # e.g. --out names an existing file: a user mistake, said in one line
        print(f"servesim: error: {exc.filename or ''}: {exc.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("servesim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
