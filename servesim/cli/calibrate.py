"""``servesim calibrate``: fit a hardware card's efficiencies and per-step overhead to measured step times.

``servesim calibrate --hardware h100-sxm --model llama-3.1-8b [--tp 1] --data FILE [--data FILE ...]
--out CARD.yaml`` reads step-time CSVs (``benchmarks/measure_step_times.py``) and/or ``vllm bench serve
--save-result`` JSON files, fits ``bandwidth_efficiency``, ``compute_efficiency`` and ``step_overhead_s``
(:mod:`servesim.analysis.calibrate`, which documents the model, the fit and how to measure), prints the
fitted factors, R^2 and the relative error of every step, and writes a new hardware card: a copy of the
base card with the fitted fields and a comment block holding the fit quality. Use it as
``hardware: path/to/CARD.yaml`` in a run config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``calibrate`` options to ``parser``."""
    parser.add_argument("--hardware", required=True, help="base hardware card: shipped name or YAML path")
    parser.add_argument("--model", required=True, help="model card that was measured: name, YAML or config.json")
    parser.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of the measurement (default 1)")
    parser.add_argument("--data", required=True, action="append", type=Path, metavar="FILE",
                        help="step-time .csv or `vllm bench serve` result .json (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="calibrated card YAML to write (default: print it)")
    parser.add_argument("--quiet", action="store_true", help="print only the summary, not the per-step table")
    parser.add_argument("--allow-poor-fit", action="store_true",
                        help="write the card even when the fit predicts worse than the data's mean (R^2 < 0)")


#: Below this coefficient of determination ``servesim calibrate`` warns that the fit is poor (the card is
#: still written: a user may want to inspect it).
POOR_FIT_R_SQUARED = 0.9
#: Below this (a fit worse than the measurements' mean) it refuses to write the card unless ``--allow-poor-fit``.
WORSE_THAN_MEAN_R_SQUARED = 0.0


def run(args: argparse.Namespace) -> int:
    """Run ``servesim calibrate``; returns the exit status.

    Raises:
        ConfigError: bad card, unreadable or malformed data (one line naming the file and line), ``--tp < 1``,
            an unwritable output file, or a fit with R^2 < 0 without ``--allow-poor-fit``.
        SettingError: a ``--tp`` the model's heads do not split over (as ``servesim run`` refuses it).
    """
    from servesim.analysis.calibrate import (
        calibrated_card_yaml,
        fit_step_times,
        fit_summary,
        fit_table,
        read_step_data,
    )
    from servesim.cards import load_hardware, load_model
    from servesim.errors import ConfigError

    if args.tp < 1:
        raise ConfigError(f"--tp: expected tensor_parallel_size >= 1 (got {args.tp})")
    if args.out is not None:
        from servesim.analysis.calibrate import CALIBRATED_MARK
        from servesim.atomic import check_output_file, remove_earlier_output_file

        # before the fit: an unwritable --out fails at once, an input (a --data file, a card given by path)
        # is not replaced, and an earlier calibrated card there is removed (a fit that fails leaves none
        # looking current; any other file is left as it is)
        from servesim.cards.loading import shipped_card_file

        cards = []
        for option, spec, kind in (("--hardware", args.hardware, "gpus"), ("--model", args.model, "models")):
            cards.append((option, spec))
            if not Path(spec).exists():  # a card given by name: its shipped file, which --out would replace
                cards.append((option, shipped_card_file(kind, spec)))
        check_output_file(args.out, inputs=(*(("--data", data) for data in args.data), *cards))
        remove_earlier_output_file(args.out, CALIBRATED_MARK)
    hardware = load_hardware(args.hardware, source="--hardware")
    model = load_model(args.model, source="--model")
    from servesim.wiring import check_tensor_parallel

    check_tensor_parallel(model, args.tp, "--tp")  # as `servesim run` checks tensor_parallel_size
    points = []
    for path in args.data:
        points.extend(read_step_data(path))
    fit = fit_step_times(hardware, model, points, args.tp)
    text = calibrated_card_yaml(hardware, fit, [str(p) for p in args.data], base_spec=str(args.hardware))
    print(f"calibrated {hardware.name} for {model.name} (tensor_parallel_size {args.tp}) "
          f"from {len(points)} measured steps")
    if not args.quiet:
        print("\n".join(fit_table(fit)))
    print("\n".join(fit_summary(fit)))
    if fit.r_squared < WORSE_THAN_MEAN_R_SQUARED and not args.allow_poor_fit:
        files = ", ".join(str(p) for p in args.data)
        raise ConfigError(f"--data: R^2 = {fit.r_squared:.3g}: the fitted step-time model predicts the steps of "
                          f"{files} worse than their mean does; no card written (check the data for outliers, "
                          "mixed setups or another model; --allow-poor-fit writes it anyway)")
    if fit.r_squared < POOR_FIT_R_SQUARED:
        print(f"servesim: warning: R^2 = {fit.r_squared:.3g} (below {POOR_FIT_R_SQUARED:g}): the step-time model "
              "explains little of these measurements; check the data for outliers or mixed setups before using "
              "the card", file=sys.stderr)
    if args.out is None:
        print(text, end="")
        return 0
    from servesim.atomic import write_text_output

    write_text_output(args.out, text)
    print(f"wrote {args.out}")
    return 0
