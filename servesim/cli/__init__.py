"""The ``servesim`` command line: a thin argparse front end over the Python API.

Every sub-command lives in its own module of this package (``run``, ``sweep``, ``plot``, ``capacity``,
``tune_k``, ``validate``, ``calibrate``, ``acceptance``, ``check_draft``), each exposing
``add_arguments(parser)`` and ``run(args) -> int``. This module only wires them up, imports the one that is
used (start-up time matters: ``servesim run`` must finish a whole trace in about a second), and turns
:class:`~servesim.errors.ServesimError` into one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import signal
import sys
import threading

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("servesim.cli.run", "simulate one config and write summary.json, requests.csv, steps.csv"),
    "sweep": ("servesim.cli.sweep", "run a grid of configs (resumable) and write summary.csv"),
    "plot": ("servesim.cli.plot", "plot the results of a sweep directory"),
    "capacity": ("servesim.cli.capacity", "find the highest rate (or fewest replicas) meeting an SLO"),
    "tune-k": ("servesim.cli.tune_k", "derive num_speculative_tokens_per_batch_size"),
    "validate": ("servesim.cli.validate", "compare predictions with published measurements"),
    "calibrate": ("servesim.cli.calibrate", "fit a hardware card to measured step times"),
    "acceptance": ("servesim.cli.acceptance", "build acceptance profiles from text or logs"),
    "check-draft": ("servesim.cli.check_draft", "check draft/target vocabulary compatibility"),
}


#: The files each command writes into its ``--out`` folder: a failed or interrupted command removes its own
#: from an existing ``--out`` (an earlier result must not look like its own), and refuses a folder that
#: holds another command's (:func:`main`). A table here, not read off the modules: importing every
#: command's module would load what ``servesim run`` does not need. The sweep's are
#: :data:`servesim.sweep.runner.SWEEP_TABLES`; its stored runs in ``points/`` stay, so that a rerun resumes.
COMMAND_OUTPUTS: dict[str, tuple[str, ...]] = {
    "run": ("summary.json", "requests.csv", "steps.csv", "latency.png"),
    "sweep": ("summary.csv", "speedup.csv"),
    "capacity": ("capacity.csv", "slo_attainment.csv", "slo_attainment.png"),
    "tune-k": ("tune_k.json", "tune_k_grid.csv", "tune_k_check.csv", "tune_k.png", "tune_k.csv"),
    "validate": ("validation.csv", "validation.png"),
}

#: What marks a folder as a command's besides its :data:`COMMAND_OUTPUTS`, never removed by another: a sweep's
#: manifest, written before its first run (a sweep interrupted, or failed after it, has no ``summary.csv``;
#: a rerun resumes from its stored runs).
COMMAND_MARKERS: dict[str, tuple[str, ...]] = {
    "sweep": ("sweep.json",),
}

#: Examples printed under ``servesim --help`` and ``servesim COMMAND --help`` (run from a clone's root;
#: tests/test_user_mistakes_outputs.py parses each one and checks that the files it names exist).
EXAMPLES: dict[str | None, list[str]] = {
    None: [
        "servesim run experiments/azure-conv-llama8b-h100.yaml --out out/azure-conv",
        "servesim sweep experiments/when-speculation-hurts.yaml --out out/when-hurts && "
        "servesim plot out/when-hurts",
        "servesim capacity experiments/capacity/azure-conv-llama8b-h100.yaml --slo ttft_p99=0.5 "
        "--slo tpot_p99=0.05 --max-requests 3000 --replications 1 --out out/capacity",
        "servesim COMMAND --help",
    ],
    "run": [
        "servesim run experiments/azure-conv-llama8b-h100.yaml --out out/azure-conv",
        "servesim run experiments/azure-conv-llama8b-h100.yaml --out out/azure-4x --set workload.rate_scale=4 "
        "--no-plot",
        "servesim run experiments/azure-conv-llama8b-h100.yaml --out out/eagle "
        "--speculative-config '{\"method\": \"eagle\", \"num_speculative_tokens\": 3}'",
    ],
    "sweep": [
        "servesim sweep experiments/seed/example12.yaml --out out/example12 --jobs 2",
    ],
    "plot": [
        "servesim plot out/example12 --slo ttft_p99=0.5",
    ],
    "capacity": [
        "servesim capacity experiments/capacity/azure-conv-llama8b-h100.yaml --slo ttft_p99=0.5 "
        "--slo tpot_p99=0.05 --max-requests 3000 --replications 1 --out out/capacity",
        "servesim capacity experiments/capacity/azure-conv-llama8b-h100.yaml --slo ttft_p99=0.5 "
        "--replicas 20 --max-requests 3000 --replications 1 --out out/replicas",
    ],
    "tune-k": [
        "servesim tune-k experiments/tune-k/llama8b-h100-eagle.yaml --jobs 2 --out out/tune-k",
    ],
    "validate": [
        "servesim validate --fast --out out/validation",
    ],
    "check-draft": [
        "servesim check-draft tests/data/vocab/target tests/data/vocab/draft-padded",
    ],
}


def _epilog(command: str | None) -> str | None:
    examples = EXAMPLES.get(command)
    return None if not examples else "examples:\n" + "\n".join(f"  {line}" for line in examples)


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


#: The attribute of a namespace being parsed that holds the options :class:`StoreOnce` has stored (removed
#: once parsing ends, :meth:`CommandParser.parse_known_args`).
OPTIONS_GIVEN = "_servesim_options_given"


class StoreOnce(argparse.Action):
    """argparse's ``store`` (every single-valued option of the commands, on argparse's public
    :class:`argparse.Action`): stores the value, and refuses the option given twice, where the last value
    would win silently (``--set`` and ``--slo`` are ``append`` options, repeatable)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(OPTIONS_GIVEN, set())
        if option_string is not None and self.dest in given:
            raise argparse.ArgumentError(self, "given twice (expected it once; the last would win silently)")
        given.add(self.dest)
        setattr(namespace, self.dest, values)


class ServesimParser(argparse.ArgumentParser):
    """argparse's parser whose ``--help`` text reaches stdout or fails loudly: argparse's own ignores a
    failed write (``servesim --help > /dev/full`` said nothing and exited 0); here the error propagates, and
    :func:`main` says it in one line with status 2."""

    def print_help(self, file=None) -> None:
        """Write the help text to ``file`` (default stdout).

        Raises:
            OSError: it cannot be written.
        """
        file = sys.stdout if file is None else file
        if file is not None:
            file.write(self.format_help())
            file.flush()


class PrintVersion(argparse.Action):
    """``--version``: argparse's version action, whose write to stdout fails loudly (see :class:`ServesimParser`)."""

    def __init__(self, option_strings, version: str, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help="show program's version number and exit") -> None:
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)
        self.version = version

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        sys.stdout.write(self.version + "\n")
        sys.stdout.flush()
        parser.exit()


class CommandParser(ServesimParser):
    """The parser of a command and of its subcommands (``acceptance ngram``, ...: argparse makes those of a
    parser's own class): single-valued options use :class:`StoreOnce`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, StoreOnce)  # the default action
        self.register("action", "store", StoreOnce)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, less :class:`StoreOnce`'s record of the options given (not an option of the command)."""
        parsed, extras = super().parse_known_args(args, namespace)
        parsed.__dict__.pop(OPTIONS_GIVEN, None)
        return parsed, extras


def build_parser(argv: list[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    parser = ServesimParser(
        prog="servesim",
        description="Simulate an LLM inference server (vLLM-style) and report TTFT, TPOT, ITL, throughput.",
        epilog=_epilog(None),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from servesim import __version__

    parser.add_argument("--version", action=PrintVersion, version=f"servesim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=CommandParser)
    sub.required = True
    modules: dict[str, object] = {}
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_) in _available().items():
        p = sub.add_parser(name, help=help_, description=help_, epilog=_epilog(name),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if wanted is None or wanted == name:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            modules[name] = module
    return parser, modules


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``timeout``, Slurm, Kubernetes): handled like Ctrl-C, so that finished work is kept
    and worker processes are stopped (:mod:`servesim.sweep.executors`)."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


#: Set by :func:`console_main`: the process ends after this command, so once a Ctrl-C or SIGTERM has been
#: handled, later ones (a key pressed again, a supervisor's repeated signal) are ignored for the exit that
#: is left, instead of interrupting it with a traceback (``servesim`` called as a function keeps them).
_CONSOLE_PROCESS = False


def _ignore_interrupts() -> None:
    """Ignore SIGINT and SIGTERM from now on (the console process, after its first interrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``servesim`` console script; returns the exit status.

    Exit status: 0 success, 1 a command's own failure report (e.g. failed sweep runs), 2 a user error (one
    line on stderr; also an input too large for memory), 130 Ctrl-C, 143 SIGTERM.
    """
    if argv is None:
        argv = sys.argv[1:]
    # SIGTERM and Ctrl-C while the command line is parsed (the command's module is imported then) get the
    # same one line as during the command, not a traceback
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main_thread else None
    try:
        parser, modules = build_parser(argv)
        try:
            args = parser.parse_args(argv)
        except BrokenPipeError:  # --help into a pipe whose reader went away: quietly, as a command's output
            _detach_stdout()
            return 128 + signal.SIGPIPE
        except OSError as exc:  # --help to a device that cannot take it (ServesimParser.print_help)
            if exc.errno not in _STORAGE_ERRNOS:
                raise
            print(f"servesim: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
            _detach_stdout()  # what is still buffered goes nowhere (the exit's own flush would fail again)
            return 2
        if _empty_out(argv):  # type=Path would turn '' into '.', the current folder
            print("servesim: error: --out: empty folder name (expected a folder path)", file=sys.stderr)
            return 2
        return _run(modules[args.command], args)
    except KeyboardInterrupt as exc:  # while the command line is parsed; the command's own are _run's
        return _interrupted(exc)
    finally:
        if in_main_thread and previous is not None and signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, previous)


def _interrupted(exc: KeyboardInterrupt) -> int:
    """Say in one line on stderr that Ctrl-C or SIGTERM stopped servesim; return the exit status. In the
    console process, further interrupts are ignored from here on (:data:`_CONSOLE_PROCESS`)."""
    if _CONSOLE_PROCESS:
        _ignore_interrupts()
    terminated = isinstance(exc, Terminated)
    print("servesim: terminated (SIGTERM)" if terminated else "servesim: interrupted", file=sys.stderr)
    return 143 if terminated else 130


def _empty_out(argv: list[str]) -> bool:
    """Whether ``argv`` gives ``--out`` an empty value (``--out ''`` or ``--out=``)."""
    return any(arg == "--out=" or (arg == "--out" and index + 1 < len(argv) and not argv[index + 1].strip())
               for index, arg in enumerate(argv))


def _run(module, args: argparse.Namespace) -> int:
    """Run ``module.run(args)``; a user error becomes one line on stderr and status 2.

    A command that fails or is interrupted at any point (a mistake in its config, Ctrl-C while it still
    imports or loads) removes the files :data:`COMMAND_OUTPUTS` names that an earlier command left in an existing
    ``--out``: none may stay there looking like the result of the command that failed; the ``--out``
    folders that it created and left empty are removed too.
    """
    out = getattr(args, "out", None)
    created = _missing_folders(out)
    status = 2  # also when a fault of servesim's raises through
    try:
        status = _run_reported(module, args, out, created)
    finally:
        if status != 0:
            for folder in created:  # the deepest first, each only if empty: a failed sweep's stored runs stay,
                try:  # for its rerun to resume
                    folder.rmdir()
                except OSError:
                    break
    return status


def _missing_folders(out: object) -> list:
    """The folders of the path ``out`` that do not exist yet, deepest first (what the command may create)."""
    from pathlib import Path

    if out is None or not str(out).strip():
        return []
    missing = []
    folder = Path(out).absolute()
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _run_reported(module, args: argparse.Namespace, out: object, created: list) -> int:
    """:func:`_run`'s command with its errors reported; ``created``: the ``--out`` folders :func:`_run` removes
    on failure, emptied when another command holds the folder (which that one may have created)."""
    from servesim.errors import ServesimError

    try:
        own = COMMAND_OUTPUTS.get(args.command, ())
        with _output_locks(args, out if own or args.command == "plot" else None, created):
            if own:
                check_no_other_results(args.command, out)
            if args.command == "sweep":
                # a folder without sweep.json (every sweep writes it first) holds no sweep's tables: files of
                # their names there are someone else's, which the sweep refuses and a failure leaves alone
                own = own + tuple(_sweep_figures(out)) if _is_sweep_folder(out) else ()
            with _replacing_earlier_outputs(out, own):
                status = int(module.run(args) or 0)
        if sys.stdout is not None:  # None: started with stdout closed (``>&-``), print() writes nothing
            sys.stdout.flush()  # a closed pipe or a full device is said here, not as a traceback at exit
        return status
    except ServesimError as exc:
        print(f"servesim: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader of the output went away (``servesim sweep ... | head -1``): stop quietly, with the status
        # of a command that SIGPIPE ended, and do not fail again flushing stdout at exit
        _detach_stdout()
        return 128 + signal.SIGPIPE
    except OSError as exc:
        if exc.filename is None and exc.errno in _STORAGE_ERRNOS:  # writing to a full disk or /dev/full
            print(f"servesim: error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if exc.filename is None:  # not about a file: a fault of servesim's, with its traceback
            raise
        # a file or folder servesim cannot read or write: --out names an existing file, a folder without
        # permission, a full disk, an output folder removed while the command ran; said in one line
        # (os.replace names the temporary file first and the file it was to become second)
        name = exc.filename2 if exc.filename2 is not None else exc.filename
        print(f"servesim: error: {name}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except MemoryError as exc:
        # a huge input (num_requests, a sweep's grid, a trace) that numpy cannot allocate: said in one line
        detail = f" ({exc})" if str(exc) else ""
        print(f"servesim: error: not enough memory{detail}: give a smaller workload, grid or trace", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Terminated)
        return _interrupted(exc)


#: errno values of a write that failed for want of space or a writable device (no file named: stdout).
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def _detach_stdout() -> None:
    """Point stdout at /dev/null (Python's advice for a closed pipe: what is still buffered goes nowhere)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no stdout descriptor (a test's capture, no console)
        pass


def check_no_other_results(command: str, out: object) -> None:
    """Refuse an ``--out`` folder that holds another command's results (its ``OUTPUTS``; every command's
    for ``plot``, whose figures go into a sweep's folder unless ``--out`` names another).

    Two commands writing into one folder would leave the first one's files (a run's ``summary.json``
    beside a sweep's ``summary.csv``) looking like results of the second; neither is removed for the
    other (a sweep's stored runs may be hours of work).

    Raises:
        OutputFolderRefused: one line naming the folder, the other command and its files found there.
    """
    from pathlib import Path

    from servesim.errors import OutputFolderRefused

    if not _existing_folder(out):
        return
    for name, outputs in COMMAND_OUTPUTS.items():
        if name == command:
            continue
        found = [f for f in outputs + COMMAND_MARKERS.get(name, ()) if (Path(out) / f).exists()]
        if found:
            raise OutputFolderRefused(f"--out: {out} holds the results of `servesim {name}` ({', '.join(found)}); "
                                      f"give `servesim {command}` another folder, or remove them first")


def _output_locks(args: argparse.Namespace, out: object, created: list):
    """The folder locks a command holds while it runs (:func:`servesim.atomic.output_folder_lock`): its
    ``--out`` (``out``; None or blank: none), so that a second command writing into the same folder is
    refused; for ``plot`` also the sweep folder it reads and by default draws into (an existing one: a
    running sweep's tables are not final). ``created`` (the folders :func:`_run` removes on failure) is
    emptied when another command holds ``--out``: the folder is that one's, also if it created it."""
    import contextlib
    from pathlib import Path

    from servesim.atomic import output_folder_lock

    stack = contextlib.ExitStack()
    sweep_dir = getattr(args, "dir", None) if args.command == "plot" else None
    if sweep_dir is not None and Path(sweep_dir).is_dir():
        stack.enter_context(output_folder_lock(sweep_dir, option="DIR"))
    if out is not None and str(out).strip():
        same = sweep_dir is not None and Path(out).is_dir() and Path(out).resolve() == Path(sweep_dir).resolve()
        if not same:  # (a second lock on one folder in one process would refuse itself)
            try:
                stack.enter_context(output_folder_lock(out, on_refused=created.clear))
            except BaseException:
                stack.close()
                raise
    return stack


def _existing_folder(out: object) -> bool:
    """Whether ``--out`` (``out``, maybe None or blank) names an existing folder."""
    from pathlib import Path

    return out is not None and bool(str(out).strip()) and Path(out).is_dir()


def _sweep_figures(out: object) -> list[str]:
    """The figures ``servesim plot`` drew into an existing sweep folder ``out`` (none when it is not one)."""
    if not _existing_folder(out):
        return []
    from pathlib import Path

    from servesim.sweep.runner import plot_figures

    return plot_figures(Path(out))


def _is_sweep_folder(out: object) -> bool:
    """Whether ``out`` is an existing folder holding a sweep's manifest (``sweep.json``, as a sweep writes it)."""
    from pathlib import Path

    if not _existing_folder(out):
        return False
    from servesim.sweep.runner import is_sweep_manifest

    return is_sweep_manifest(Path(out) / "sweep.json")


def _replacing_earlier_outputs(out: object, names: tuple[str, ...]):
    """:func:`servesim.atomic.replacing_outputs` over ``names`` in ``out`` when ``out`` is an existing folder
    (nothing to remove otherwise: a missing folder is not created, a file is refused by the command), on
    failure only: each command removes its earlier outputs itself before it computes new ones (a sweep
    keeps the figures of a table it writes again unchanged)."""
    import contextlib

    if not names or not _existing_folder(out):
        return contextlib.nullcontext()
    from servesim.atomic import replacing_outputs

    return replacing_outputs(out, names, before=False)


def console_main() -> None:
    """Entry point of the ``servesim`` console script and of ``python -m servesim``: :func:`main`, then
    :func:`exit_process` with its status (``main`` itself returns, for callers in a Python process).

    ``OPENBLAS_NUM_THREADS`` defaults to 1 in the process (and its children), unless set (see below).

    ``servesim run`` runs with Python's cyclic garbage collector paused from the start: the process is
    one simulation and ends after it, its start-up objects (modules, classes, the config) live until the
    end, and the engine makes no reference cycles (tests/test_collector.py), so the collector's passes
    would find nothing to free (about 15 ms of the Azure run's 0.65 s, README "Performance"). Reference
    counting still frees everything else as usual. The other commands, which can run many simulations in
    one process, keep it.

    After a Ctrl-C or SIGTERM has stopped the command (its one line said, exit status 130 or 143), further
    ones are ignored while the process ends, so pressing Ctrl-C again never prints a traceback.
    """
    # numpy's OpenBLAS starts a pool of threads at import that spin on the other cores between calls;
    # servesim does no multi-threaded linear algebra (its arrays are integer bookkeeping and small fits),
    # so one thread: 110 ms less CPU time and 8 ms less wall time for the Azure run, and no oversubscribed
    # cores under a sweep's worker processes, which inherit it. A value the user set is kept.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    if sys.argv[1:2] == ["run"]:
        import gc

        gc.disable()
    global _CONSOLE_PROCESS
    _CONSOLE_PROCESS = True
    try:
        status = main()
    except KeyboardInterrupt as exc:  # a second Ctrl-C or SIGTERM while the first was being handled
        status = _interrupted(exc)
    exit_process(status)


def exit_process(status: int) -> None:
    """End the process with ``status`` without tearing the interpreter down.

    A finished command has written and closed its files; what Python's normal exit does after that is
    free every object and module one by one (about 10 ms after a ``servesim run`` of the Azure trace,
    README "Performance"). This runs the ``atexit`` handlers (multiprocessing's included), flushes stdout
    and stderr and calls :func:`os._exit`. It falls back to :func:`sys.exit` when a non-daemon thread is
    still alive (the normal exit waits for it) or a flush fails (a closed pipe: the normal exit reports it
    as it always has).

    Raises:
        SystemExit: only on the fallback.
    """
    import atexit

    if any(not thread.daemon for thread in threading.enumerate() if thread is not threading.main_thread()):
        sys.exit(status)
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(status)
    os._exit(status)


if __name__ == "__main__":  # pragma: no cover
    console_main()
