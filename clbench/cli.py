"""``clbench``: parses flags and dispatches each command to its body in the package it belongs to
(:mod:`clbench.run.commands`, :mod:`clbench.sweep.commands`, :mod:`clbench.report.commands`, ...). No other logic.

Those bodies are imported when their command runs, so that ``clbench --help`` and ``clbench list`` answer at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from clbench import __version__
from clbench.errors import ClbenchError


def parse_key_value(text: str) -> tuple[str, str]:
    """``--set KEY=VALUE`` -> (KEY, VALUE), for argparse."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _add_setting_args(p: argparse.ArgumentParser, command: str) -> None:
    """The run settings of ``clbench COMMAND`` (run or sweep), generated from :class:`clbench.core.config.RunConfig`
    (one declaration per setting: flag, type, default, help), then the options every run takes."""
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.core.config import add_run_flags

    add_run_flags(p, command)
    p.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="settings from a YAML file: the same keys as the flags (init-cls: 10), strategy settings under the "
        "strategy's name (tosca: {epochs: 5}); flags given here override the file. See clbench/examples/TRACKERS.md",
    )
    p.add_argument(
        "--log",
        metavar="T1,T2",
        help="experiment trackers to log to as the run goes: tensorboard, mlflow, wandb (any combination; "
        "pip install 'clbench[trackers]'). Offline by default; a tracker that fails never fails the run",
    )
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        help="--log: where trackers write (DIR/tensorboard/RUN, DIR/mlruns.db with artifacts in DIR/mlruns, "
        "DIR/wandb); default: the run folder (a sweep's MLflow runs: SWEEP_OUT/mlruns.db), or $MLFLOW_TRACKING_URI "
        "for MLflow; never the working folder. `clbench run` ends by printing each location",
    )


def _add_run_args(p: argparse.ArgumentParser) -> None:
    _add_setting_args(p, "run")
    p.add_argument(
        "--set",
        dest="overrides",
        type=parse_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one strategy setting (repeatable), e.g. --set epochs=5",
    )
    p.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the unfinished run in DIR from its checkpoint, with the settings it was started "
        "with (other flags given must match them). Running the same command with the same --out "
        "again continues it too",
    )
    p.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="convert the run folder's checkpoint.pt (the old pickle format, refused otherwise) to the current "
        "format. Unpickling it EXECUTES ANY CODE the file carries: only for a run you made yourself",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="make every check a run makes before learning (settings, data, split, weights, --out) and print the "
        "plan; train and write nothing",
    )


def _add_sweep_args(p: argparse.ArgumentParser) -> None:
    """The sweep's own flags, generated from :mod:`clbench.sweep.settings` (one declaration per setting), ``--set``,
    then the run settings every run shares."""
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.core.config import argument_group
    from clbench.sweep.settings import WHAT, add_sweep_flags

    add_sweep_flags(p)
    argument_group(p, WHAT).add_argument(
        "--set",
        dest="overrides",
        type=parse_key_value,
        action="append",
        default=[],
        metavar="[STRATEGY.]KEY=VALUE",
        help="override a strategy setting for every strategy, or for one with STRATEGY.KEY (repeatable)",
    )
    _add_setting_args(p, "sweep")


def _add_export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUNS", help="run folders, or folders that hold run folders")
    p.add_argument("--to", required=True, metavar="T1,T2", help="tensorboard, mlflow, wandb (any combination)")
    p.add_argument(
        "--log-dir",
        metavar="DIR",
        help="where trackers write: DIR/tensorboard/RUN, DIR/mlruns.db and DIR/mlruns (or $MLFLOW_TRACKING_URI), "
        "DIR/wandb (default: the first RUNS folder)",
    )
    p.add_argument("--group", help="MLflow experiment / W&B group of the runs (default: clbench)")


# Each command's body lives in its package, imported when the command runs (``clbench --help`` stays torch-free).
def cmd_run(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.run.commands import run_command

    return run_command(args, figures=_run_figures)


def _run_figures(record: Any, run_dir: Path, out: Path) -> list[Path]:
    """The run's figures for the trackers (``--log``), drawn by the report: the driver draws none itself."""
    # deferred: loads matplotlib, and only where a tracker asks for figures
    from clbench.report.run_figures import run_figures

    return run_figures(record, run_dir, out)


def cmd_sweep(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.sweep.commands import sweep_command

    return sweep_command(args)


def cmd_export(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.report.tracker_export import export_command

    return export_command(args)


def cmd_records_upgrade(args: argparse.Namespace) -> int:
    # deferred: loads numpy, which importing this module does not
    from clbench.records.upgrade import upgrade_command

    return upgrade_command(args)


def cmd_list(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.run.describe import print_catalog, print_method

    if args.name is None:
        print_catalog()
    else:
        print_method(args.name)  # an unknown name: the valid ones and "did you mean"
    return 0


def _add_list_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name", nargs="?", metavar="NAME", help="one strategy: its settings, profiles, reference, deviations"
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.perf.doctor import doctor

    doctor(measure=not args.no_measure)
    return 0


def _add_doctor_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-measure", action="store_true", help="skip the short throughput measurement (about 15 s)")


def cmd_weights(args: argparse.Namespace) -> int:
    # deferred: loads rich, which importing this module does not
    from clbench.weights.info import print_weights

    print_weights()
    return 0


class _MeasurementList:
    """The registered measurements with their help, formatted only when ``clbench perf --help`` is printed (it
    imports the strategies, whose own measurements are listed too), so ``clbench --help`` stays torch-free."""

    def __str__(self) -> str:
        # deferred: each command loads only what it runs (--help answers in about a second)
        from clbench.perf import listing

        return listing()


def _add_perf_args(p: argparse.ArgumentParser) -> None:
    which = p.add_argument(
        "which",
        metavar="NAME",
        help="which measurement (its flags: `clbench perf NAME --help`): %(measurements)s",
    )
    which.measurements = _MeasurementList()  # read by argparse's help expansion: %(measurements)s
    p.add_argument("flags", nargs=argparse.REMAINDER, metavar="...", help="the measurement's flags")


def cmd_perf(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.perf import measurements, run_measurement, write

    m = measurements().get(args.which)  # an unknown name: the valid ones and "did you mean"
    parser = _Parser(prog=f"clbench perf {m.name}", description=m.help)
    m.add_arguments(parser)
    flags = parser.parse_args(args.flags)
    write(run_measurement(m, flags), flags.out)  # temporary files removed on SIGTERM too
    return 0


def _published():
    # deferred: each command loads only what it runs (--help answers in about a second)
    import clbench.published

    return clbench.published


def _add_tune_args(p: argparse.ArgumentParser) -> None:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.tune.command import add_args

    add_args(p, parse_key_value)


def cmd_tune(args: argparse.Namespace) -> int:
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.tune.command import main as tune

    return tune(args)


COMMANDS: dict[
    str, tuple[str, Callable[[argparse.ArgumentParser], None] | None, Callable[[argparse.Namespace], int]]
] = {
    "run": ("run one strategy on one benchmark and write its record", _add_run_args, cmd_run),
    "sweep": (
        "run strategies x benchmarks x seeds (locally or on Ray), then the summary table and report",
        _add_sweep_args,
        cmd_sweep,
    ),
    "tune": (
        "choose a strategy's settings on a validation split (Optuna), never reading the test images",
        _add_tune_args,
        cmd_tune,
    ),
    "list": (
        "list registered strategies (family, what each trains, scenarios, profiles), benchmarks and backbones; "
        "`clbench list NAME`: one strategy's settings, profiles, reference and deviations",
        _add_list_args,
        cmd_list,
    ),
    "weights": (
        "list backbones, whether their weights are available offline here, and how to get them",
        None,
        cmd_weights,
    ),
    "doctor": (
        "print this machine's device, CPU capability, measured speed per precision and thread count, the "
        "precision auto picks, the cache, and which weights and data are present (for bug reports)",
        _add_doctor_args,
        cmd_doctor,
    ),
    "perf": ("measure speed ratios, cost projections and parameter counts, and record them", _add_perf_args, cmd_perf),
    "published": (
        "the published results of every method clbench carries, with sources, and (--commands) the clbench command "
        "that measures each",
        lambda p: _published().add_published_args(p),
        lambda args: _published().cmd_published(args),
    ),
    "export": (
        "send finished runs (a report folder, a sweep) to TensorBoard, MLflow or W&B, as `--log` does during a run",
        _add_export_args,
        cmd_export,
    ),
}


def _all_commands() -> dict:
    # deferred: loads numpy, which importing this module does not
    from clbench.gate.commands import COMMANDS as GATE_COMMANDS
    from clbench.report.commands import COMMANDS as REPORT_COMMANDS

    report, compare, *later = REPORT_COMMANDS.items()  # `check` listed after `compare`, as it always was
    return {**COMMANDS, **dict([report, compare]), **GATE_COMMANDS, **dict(later)}


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's help, wrapped without breaking names at their hyphens (``tosca-routing`` stays one word)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        text = self._whitespace_matcher.sub(" ", text).strip()
        return textwrap.fill(text, width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """argparse's refusals (a missing value, ``--seed abc``) as one ``clbench: error:`` line and a hint, exit 2, like
    every other bad input; argparse prints the whole usage block instead. Help text wraps at spaces only."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        # deferred: each command loads only what it runs (--help answers in about a second)
        from clbench.files.escape import plain

        self.exit(2, f"clbench: error: {plain(message)}\n  hint: see `{self.prog} --help`\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; ``only``: the flags of that command alone (the others are named, with their help,
    but their flags are not built: ``clbench run`` does not import the gate's modules to describe ``check``)."""
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.core.catalog import DEFAULT_STRATEGY

    parser = _Parser(
        prog="clbench",
        description="Class-incremental learning on frozen pre-trained ViTs: every registered strategy "
        "(`clbench list`) on Avalanche streams, with records, reports and a regression gate.",
        epilog=f"example: clbench run --strategy {DEFAULT_STRATEGY}   (embedded benchmark, offline ViT-S/14)",
    )
    parser.add_argument("--version", action="version", version=f"clbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.commands = {}  # name -> its parser (clbench.run.configfile sets a --config file's values as its defaults)
    for name, (help_text, add_args, func) in _all_commands().items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if add_args and only in (None, name):
            add_args(p)
        p.set_defaults(func=func, make_parser=build_parser)  # a command that reads a sweep file parses it
        parser.commands[name] = p
    # deferred: loads numpy, which importing this module does not
    from clbench.benchmarks.check import add_data_check_args, cmd_data_check

    data = sub.add_parser("data", help="data utilities: `clbench data check BENCH --data-root DIR`")
    data_sub = data.add_subparsers(dest="data_command", metavar="DATA_COMMAND", parser_class=_Parser)
    check = data_sub.add_parser(
        "check",
        help="validate a data root before a long run",
        description="validate a data root before a long run: classes, images per split, "
        "unreadable files, train/test duplicates",
    )
    add_data_check_args(check)
    check.set_defaults(func=cmd_data_check)
    records = sub.add_parser("records", help="run-record utilities: `clbench records upgrade DIR`")
    records_sub = records.add_subparsers(dest="records_command", metavar="RECORDS_COMMAND", parser_class=_Parser)
    upgrade = records_sub.add_parser(
        "upgrade",
        help="rewrite old run records (schema 1-3) at the current schema, in place, once",
        description="rewrite every run record (result.json) under each DIR at the current schema version, in "
        "place: readers refuse records of schema 1 to 3, whose parameter counts only the method's code can restate "
        "(clbench.records.upgrade). Numbers keep their meaning; records already current are not touched.",
    )
    upgrade.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="run folders or folders of them")
    upgrade.add_argument("--dry-run", action="store_true", help="list what would be upgraded; write nothing")
    upgrade.set_defaults(func=cmd_records_upgrade)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(only=given[0] if given and given[0] in _all_commands() else None)
    except ClbenchError as e:  # e.g. a malformed CLBENCH_PLUGINS
        print(f"clbench: error: {e.for_terminal()}", file=sys.stderr)
        return e.exit_code
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        return _refuse_unknown(parser, args, unknown)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.records.command import set_invocation

    set_invocation(list(sys.argv[1:] if argv is None else argv))  # the records name the command as typed
    try:
        with warnings.catch_warnings():  # a library's warning quotes what it was given (a record's names): visible
            warnings.showwarning = _show_warning
            return _dispatch(args, argv)
    finally:
        set_invocation(None)


def _refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace, unknown: list[str]) -> int:
    """Flags the command does not take: one error line and a pointer to what the user meant (exit 2). A strategy
    setting given as a flag (``--epochs 5``) points to ``--set epochs=5``; a sweep's flag given to ``run``
    (``--seeds 1993,1994``) to ``clbench sweep``; a misspelt flag to the closest one."""
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.files.escape import plain

    command = getattr(args, "command", None)
    sub = parser.commands.get(command, parser) if command else parser  # type: ignore[attr-defined]
    print(f"clbench: error: unrecognized arguments: {plain(' '.join(unknown))}", file=sys.stderr)
    print(f"  hint: {plain(_unknown_flag_hint(sub, command, args, unknown))}", file=sys.stderr)
    return 2


def _unknown_flag_hint(
    sub: argparse.ArgumentParser, command: str | None, args: argparse.Namespace, unknown: list[str]
) -> str:
    import difflib

    i = next((i for i, x in enumerate(unknown) if x.startswith("-")), None)
    prog = f"clbench {command}" if command else "clbench"
    if i is None:
        return f"see `{prog} --help`"
    flag, _, value = unknown[i].partition("=")
    if not value:
        after = unknown[i + 1] if i + 1 < len(unknown) else ""
        value = after if after and not after.startswith("-") else "VALUE"
    key = flag.lstrip("-").replace("-", "_")
    if command in ("run", "sweep"):
        # deferred: each command loads only what it runs (--help answers in about a second)
        from clbench.core.catalog import CARDS, STRATEGIES, card

        strategy = getattr(args, "strategy", None)
        names = [strategy] if strategy in STRATEGIES else CARDS.names()
        if any(key in {f.name for f in dataclasses.fields(card(n).Config)} for n in names):
            shown = f"`clbench list {strategy}`" if strategy in STRATEGIES else "`clbench list STRATEGY`"
            return f"{flag} is a strategy setting: give it as --set {key}={value} ({shown} lists the settings)"
    if command == "run":
        sweep_flags = build_parser(only="sweep").commands["sweep"]._option_string_actions  # type: ignore[attr-defined]
        if flag in sweep_flags:
            strategy = getattr(args, "strategy", None) or "STRATEGY"
            example = f"clbench sweep --strategies {strategy} {flag} {value}"
            return f"{flag} is a flag of clbench sweep, which runs several: {example}"
    close = difflib.get_close_matches(flag, [o for o in sub._option_string_actions if o.startswith("--")], n=1)
    return f"did you mean {close[0]}?" if close else f"see `{prog} --help`"


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, *_: object) -> None:
    """A Python warning on the terminal, every control character in it made visible
    (:func:`clbench.files.escape.plain`):
    matplotlib and others quote labels and names from records, which may carry escape sequences."""
    # deferred: each command loads only what it runs (--help answers in about a second)
    from clbench.files.escape import plain

    print(f"{plain(str(filename))}:{lineno}: {category.__name__}: {plain(str(message))}", file=sys.stderr)


def _dispatch(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    try:
        if getattr(args, "config", None):  # the file's settings under the flags given here; a sweep file's groups
            # deferred: each command loads only what it runs (--help answers in about a second)
            from clbench.run.configfile import apply

            code = 0
            for one in apply(build_parser, sys.argv[1:] if argv is None else argv, args.command, args.config):
                if getattr(one, "group_name", None):
                    print(f"group {one.group_name}: {one.out}")
                code = max(code, one.func(one))
            return code
        return args.func(args)
    except ClbenchError as e:
        print(f"clbench: error: {e.for_terminal()}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # whoever read the output stopped (`clbench list | head`): nothing is lost, say nothing
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the final flush must not fail again
        return 141  # 128 + SIGPIPE, as a shell tool ended by the closed pipe reports
    except KeyboardInterrupt:
        print(
            "clbench: interrupted; every run folder keeps its last finished task: the same command again "
            "continues (or `clbench run --resume DIR` for one run)",
            file=sys.stderr,
        )
        return 130


def entry() -> None:
    """The ``clbench`` console script (and ``python -m clbench.cli``): :func:`main`, its code the process's exit
    status (the interpreter's ordinary exit: other threads joined, ``atexit`` handlers run, output flushed)."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
