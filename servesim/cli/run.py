"""``servesim run CONFIG.yaml --out DIR``: simulate one config and write its results.

Writes ``DIR/summary.json``, ``DIR/requests.csv``, ``DIR/steps.csv`` and (unless ``--no-plot``)
``DIR/latency.png``, and prints a short summary table. pandas and matplotlib are not imported on the
``--no-plot`` path: their imports alone cost more than simulating a 19,000-request trace.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path
from typing import Any

from servesim.cli import COMMAND_OUTPUTS


#: Files ``servesim run`` writes into ``--out``.
RUN_OUTPUTS = COMMAND_OUTPUTS["run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config (YAML)")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--seed", type=_seed, default=None, help="override the config's seed (integer >= 0; default: the config's seed, 0 if it has none)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value by dotted key, e.g. --set engine.max_num_seqs=128 (repeatable)",
    )
    parser.add_argument(
        "--speculative-config",
        default=None,
        metavar="JSON",
        help="vLLM's --speculative-config JSON, e.g. '{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'",
    )
    parser.add_argument(
        "--llama-cpp-spec",
        default=None,
        metavar="FLAGS",
        help="llama.cpp server's speculative flags instead of --speculative-config, e.g. "
        "--llama-cpp-spec=\"--spec-type ngram-simple --spec-ngram-simple-size-n 3\" "
        "(servesim.speculation.llamacpp; --set speculative_config.KEY=... still applies after it)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip latency.png (faster)")
    parser.add_argument("--quiet", action="store_true", help="print nothing on success (no progress bar either)")


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 (got {text!r})") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 (got {value})")
    return value


def parse_overrides(
    assignments: list[str], speculative_json: str | None, llama_cpp_flags: str | None = None
) -> list[tuple[str, Any]]:
    """Turn ``--set`` assignments and ``--speculative-config`` (or ``--llama-cpp-spec``) into dotted overrides.

    ``--speculative-config`` (or ``--llama-cpp-spec``) replaces ``speculative_config`` FIRST, then the
    ``--set`` assignments apply in the order given (so ``--set speculative_config.num_speculative_tokens=5``
    refines the JSON, and a later ``--set`` of the same key wins); ``--spec-type none`` removes speculation.

    Returns:
        ``(dotted key, value)`` pairs in the order to apply them (see :func:`servesim.config.models.load_config`).

    Raises:
        ConfigError: invalid JSON or flags, an invalid ``--set``, both ``--speculative-config`` and
            ``--llama-cpp-spec``, or a speculative config that fails validation when no ``--set`` refines it
            (named ``--speculative-config`` or ``--llama-cpp-spec``).
    """
    from servesim.config.overrides import parse_assignment
    from servesim.errors import ConfigError

    overrides: list[tuple[str, Any]] = []
    if llama_cpp_flags is not None:
        if speculative_json is not None:
            raise ConfigError("--llama-cpp-spec and --speculative-config are mutually exclusive: give one")
        from servesim.speculation.llamacpp import parse_llamacpp_flags

        overrides.append(("speculative_config", parse_llamacpp_flags(llama_cpp_flags, "--llama-cpp-spec")))
    if speculative_json is not None:
        from servesim.json_objects import DuplicateJSONKey, loads_unique

        try:
            spec = loads_unique(speculative_json)
        except DuplicateJSONKey as exc:
            raise ConfigError(f"--speculative-config: key {exc.args[0]!r} given twice (expected each key once)"
                              ) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--speculative-config: invalid JSON ({exc.msg} at column {exc.colno})") from None
        except ValueError as exc:  # an integer of more digits than int() converts (sys.get_int_max_str_digits)
            raise ConfigError(f"--speculative-config: invalid JSON ({exc})") from None
        if not isinstance(spec, dict):
            raise ConfigError("--speculative-config: expected a JSON object")
        overrides.append(("speculative_config", spec))
    for text in assignments:
        overrides.append(parse_assignment(text))
    option = speculative_option(assignments, speculative_json, llama_cpp_flags)
    if option is not None and overrides[0][1] is not None:  # None: --spec-type none removes speculation
        # the option gives the run's whole speculative_config (no --set refines it): its mistakes name the
        # option, and the key as --set takes it
        from servesim.input_files import validate
        from servesim.speculation.config import SpeculativeConfig

        validate(SpeculativeConfig, overrides[0][1], option, key_prefix="speculative_config")
    return overrides


def set_keys(assignments: list[str]) -> list[str]:
    """The dotted keys of ``--set KEY=VALUE`` assignments (already checked by :func:`parse_overrides`)."""
    return [text.split("=", 1)[0].strip() for text in assignments]


def mapping_set_keys(assignments: list[str]) -> list[str]:
    """The dotted keys that ``--set KEY=VALUE`` assignments give only inside a mapping value
    (``workload={type: poisson, rate: 9}`` gives ``workload.type`` and ``workload.rate``), not as a key of their
    own: what a command that replaces or ignores a key notes rather than refuses (such a mapping may need the
    key to be a valid config)."""
    from servesim.config.overrides import parse_assignment

    def leaves(prefix: str, value) -> list[str]:
        keys = []
        if isinstance(value, dict):
            for name, item in value.items():
                keys += [f"{prefix}.{name}"] + leaves(f"{prefix}.{name}", item)
        return keys

    given = set(set_keys(assignments))
    found: list[str] = []
    for text in assignments:
        key, value = parse_assignment(text)
        found += [leaf for leaf in leaves(key, value) if leaf not in given]
    return found


def speculative_option(assignments: list[str], speculative_json: str | None,
                       llama_cpp_flags: str | None = None) -> str | None:
    """The option (``--speculative-config`` or ``--llama-cpp-spec``) that gives the run's whole
    ``speculative_config``, or None when neither is given or a ``--set speculative_config...`` refines it
    (its mistakes are then the config's)."""
    if llama_cpp_flags is None and speculative_json is None:
        return None
    if any(text.split("=", 1)[0].strip().split(".")[0] == "speculative_config" for text in assignments):
        return None
    return "--llama-cpp-spec" if llama_cpp_flags is not None else "--speculative-config"


def _check_window(summary: dict, cfg) -> None:
    """Refuse a ``simulation.measure`` window that holds no completed request (its throughputs would read 0).

    Raises:
        SettingError: one line naming the config's file, the key, the window and the completed requests.
    """
    from servesim.errors import SettingError

    window = summary.get("measurement_window")
    if window is None or window["completed"] > 0 or not summary.get("completed"):
        return
    where = f"{cfg.source}: " if cfg.source is not None else ""
    raise SettingError(f"{where}simulation.measure: the window from {window['start_s']:.6g} s to {window['end_s']:.6g} s "
                       f"holds none of the run's {summary['completed']} completed requests (expected bounds that leave "
                       "some inside: after_completed below the requests, after_s before the last finish)")


def _refuse_inputs_among_outputs(cfg, folder: Path, out: Any) -> None:
    """Refuse an existing ``--out`` where a file the config names (a trace, a workload or card file, a
    profile) is one of the run's outputs: removing the earlier run's outputs would delete it.

    Raises:
        OutputFolderRefused: one line naming the file (nothing in the folder is removed).
    """
    from servesim.errors import OutputFolderRefused

    if out is None or not str(out).strip() or not Path(out).is_dir():
        return
    outputs = {(Path(out) / name).resolve(): name for name in RUN_OUTPUTS}
    pending = [cfg.model_dump(mode="json")]
    while pending:  # every string in the config, depth first
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif isinstance(value, str) and value and "\0" not in value and "\n" not in value:
            path = Path(value).expanduser()
            try:
                path = (path if path.is_absolute() else folder / path).resolve()
            except (OSError, RuntimeError, ValueError):
                continue
            if path in outputs and path.is_file():
                raise OutputFolderRefused(f"--out: {path} is an input of this run, and the run writes its "
                                          f"{outputs[path]} there: give another --out folder")


def run(args: argparse.Namespace) -> int:
    from servesim.config.models import load_config
    from servesim.metrics import format_summary_table, write_outputs
    from servesim.api import simulate
    from servesim.atomic import prepare_output_dir, remove_stale, replacing_outputs
    from servesim.errors import naming_option_of, naming_set_keys

    # the modules just imported live as long as the process: out of the garbage collector's sight
    # (gc.freeze), its full collections during the run walk only the run's own objects
    gc.freeze()
    # (a mistake in the config removes an earlier run's outputs from an existing --out: servesim.cli._run)
    cfg, folder = load_config(args.config, parse_overrides(args.overrides, args.speculative_config,
                                                          getattr(args, "llama_cpp_spec", None)),
                              set_keys=set_keys(args.overrides))
    _refuse_inputs_among_outputs(cfg, folder, args.out)  # before an earlier run's outputs are removed
    out_dir = prepare_output_dir(args.out)  # before the simulation: an unwritable --out fails at once
    # a failure or Ctrl-C while simulating or writing leaves none of the outputs (no partial set), also in a
    # folder this run created
    with replacing_outputs(out_dir, RUN_OUTPUTS):
        # a setting of --speculative-config refused when the run is set up names the option, not the file
        option = speculative_option(args.overrides, args.speculative_config, getattr(args, "llama_cpp_spec", None))
        with naming_option_of("speculative_config", option, cfg.source), naming_set_keys(set_keys(args.overrides),
                                                                                         cfg.source):
            result = simulate(cfg, seed=args.seed, base_dir=folder, progress=not args.quiet)
            summary = dict(result.summary)
            _check_window(summary, cfg)
        summary["setup"] = result.info
        summary["seed"] = cfg.seed if args.seed is None else args.seed
        for note in result.info.get("notes", ()):  # e.g. a profile measured with another method
            print(f"servesim: note: {note}", file=sys.stderr, flush=True)
        if args.no_plot:
            remove_stale(out_dir, ["latency.png"])  # an earlier run's figure must not sit beside these CSVs
        else:
            from servesim.plots.latency import plot_latency

            plot_latency(result.output, summary, out_dir / "latency.png")
        # summary.json last (write_outputs): once it exists, the run's files are all there, also after a
        # kill -9 that no cleanup follows
        write_outputs(result.output, summary, out_dir)
    if not args.quiet:
        print(format_summary_table(summary))
        print(f"wrote {out_dir}/summary.json, requests.csv, steps.csv" + ("" if args.no_plot else ", latency.png"))
    if sys.stdout is not None:  # None: started with stdout closed (``>&-``)
        sys.stdout.flush()
    return 0
