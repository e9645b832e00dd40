"""The magics: %%torchrun (a one-shot torchrun job) and %ranks / %%ranks (live ranks).

Flags mirror launch()'s and Session()'s keyword arguments, and their defaults are read from
those signatures (one source of defaults); the help (`%%torchrun?`, `%ranks?`) is generated
from the flag definitions.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import shlex
from collections.abc import Callable

from ..shared.errors import CellSyntaxError, LaunchConfigError
from .hosts import LAUNCHERS
from .launch import launch
from .output import OUTPUT_MODES
from .torchrun import DEBUG_LEVELS


class MagicParser(argparse.ArgumentParser):
    """argparse that raises LaunchConfigError (never sys.exit inside a kernel), and takes a
    flag only by its full name (a script's `--time` is not the kit's `--timeout`)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def error(self, message: str) -> None:
        usage = self.format_usage().strip().removeprefix("usage: ")
        raise LaunchConfigError(f"{self.prog}: {message}. Usage: {usage}")


def variable_name(text: str) -> str:
    """An argparse type: a flag naming the notebook variable that receives a result."""
    if not text.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not a variable name")
    return text


def default_of(function: Callable, name: str) -> object:
    """The default value of `function`'s parameter `name`."""
    return inspect.signature(function).parameters[name].default


def _run_flags(function: Callable) -> dict[tuple[str, ...], dict]:
    """The flags %%torchrun and `%ranks start` share, with `function`'s defaults."""
    default = functools.partial(default_of, function)
    seconds = "seconds a collective waits for the other ranks (default: %(default)s)"
    modes = f"{MODES_HELP} (default: %(default)s)"
    return {
        ("-n", "--nproc"): {"type": int, "default": default("nproc"),
                            "help": "ranks per node (default: %(default)s)"},
        ("--nnodes",): {"type": int, "default": default("nnodes"),
                        "help": "torchrun agents, as if each were a machine "
                                "(default: %(default)s)"},
        ("--backend",): {"default": default("backend"),
                         "help": "auto, gloo or nccl (default: %(default)s: nccl only with a GPU "
                         "per rank)"},
        ("--collective-timeout",): {"type": float, "default": default("collective_timeout"),
                                    "help": seconds},
        ("--output",): {"choices": OUTPUT_MODES, "default": default("output"), "help": modes},
        ("--debug",): {"choices": list(DEBUG_LEVELS), "default": default("debug"),
                       "help": "TORCH_DISTRIBUTED_DEBUG for the ranks; info: DDP names the "
                       "parameters that got no gradient; detail: before every collective the "
                       "ranks compare its type, sequence number and tensor shapes, dtypes and "
                       "devices, and name both if they differ (torch 2.13, gloo: DDP built on a "
                       "group made under detail crashes the rank) (default: %(default)s)"},
    }  # fmt: skip


# How the ranks' lines are shown, for the help of every flag that chooses it.
MODES_HELP = "; ".join(f"{mode}: {meaning}" for mode, meaning in OUTPUT_MODES.items())


def _run_parser(
    prog: str, description: str, function: Callable, extra: dict[tuple[str, ...], dict]
) -> MagicParser:
    """A parser with the shared run flags (defaults from `function`) and `extra` ones."""
    parser = MagicParser(prog=prog, add_help=False, description=description)
    for names, options in {**_run_flags(function), **extra}.items():
        parser.add_argument(*names, **options)
    return parser


def _host_flags(function: Callable) -> dict[tuple[str, ...], dict]:
    """The flags that place the nodes on other hosts, with `function`'s defaults."""
    return {
        ("--hosts",): {
            "default": default_of(function, "hosts"),
            "help": "one node on each of these hosts, as ssh reaches them (slurm: node names "
            "of the allocation), comma-separated: --hosts gpu1,gpu2 --launcher ssh (default: "
            "this machine; with --launcher slurm, every node of the kernel's allocation)",
        },
        ("--launcher",): {
            "choices": LAUNCHERS,
            "default": default_of(function, "launcher"),
            "help": "how the nodes' agents start: local (this machine), ssh (one connection "
            "per host) or slurm (srun, inside the kernel's allocation) (default: %(default)s)",
        },
        ("--python",): {
            "default": default_of(function, "python"),
            "help": "the Python on the hosts (default: this kernel's path)",
        },
    }


def torchrun_parser() -> MagicParser:
    """The flags of %%torchrun, with launch()'s defaults."""
    extra = {
        ("--timeout",): {
            "type": float,
            "default": default_of(launch, "timeout"),
            "help": "seconds the whole run may take (default: %(default)s)",
        },
        ("--max-restarts",): {
            "type": int,
            "default": default_of(launch, "max_restarts"),
            "help": "times torchrun may restart every rank after one fails; a rank reads its "
            "attempt from TORCHELASTIC_RESTART_COUNT (default: %(default)s)",
        },
        ("--monitor-interval",): {
            "type": float,
            "default": default_of(launch, "monitor_interval"),
            "help": "seconds between torchrun's checks of its ranks (default: torchrun's, 0.1)",
        },
        **_host_flags(launch),
        ("--result",): {
            "type": variable_name,
            "default": "last_run",
            "help": "variable that receives the RunResult (default: %(default)s)",
        },
    }
    description = (
        "Run the cell as a script on N ranks with torchrun (a one-shot job: processes start, "
        "run the cell, and end). Words after `--` are the script's arguments, its "
        "sys.argv[1:]: %%torchrun -n 2 -- 50 5 --batch_size 32"
    )
    return _run_parser("%%torchrun", description, launch, extra)


def split_script_args(line: str) -> tuple[list[str], list[str]]:
    """A magic's line as (its flags, the script's arguments): the words before and after the
    first `--`."""
    words = shlex.split(line)
    if "--" not in words:
        return words, []
    cut = words.index("--")
    return words[:cut], words[cut + 1 :]


def _options(args: argparse.Namespace, *not_passed: str) -> dict:
    """The parsed flags as keyword arguments (each flag is named after its parameter)."""
    return {k: v for k, v in vars(args).items() if k not in not_passed}


def torchrun_magic(line: str, cell: str, namespace: dict) -> None:
    """Run `cell` with torchrun, the words after `--` as its arguments; store the RunResult in
    namespace[--result] (default last_run)."""
    flags, script_args = split_script_args(line)
    args, unknown = torchrun_parser().parse_known_args(flags)
    if unknown:
        kept = list(flags)
        for word in reversed(unknown):  # argparse leaves them in order: take each from the end
            del kept[len(kept) - 1 - kept[::-1].index(word)]
        known = shlex.join(kept)
        raise LaunchConfigError(
            f"%%torchrun: unrecognized arguments: {' '.join(unknown)}. The script's own "
            f"arguments go after `--`: %%torchrun {known} -- {shlex.join([*unknown, *script_args])}"
        )
    try:
        result = launch(cell, args=script_args, **_options(args, "result"))
    except Exception as error:
        if hasattr(error, "result"):
            namespace[args.result] = error.result
        raise
    namespace[args.result] = result


def session_parser() -> MagicParser:
    """The flags of `%ranks start`, with Session()'s defaults."""
    from .session import Session

    extra = {
        ("--cell-timeout",): {
            "type": float,
            "default": default_of(Session, "cell_timeout"),
            "help": "seconds a cell may run before its ranks are interrupted "
            "(default: %(default)s)",
        },
        ("--idle-timeout",): {
            "type": float,
            "default": default_of(Session, "idle_timeout"),
            "help": "seconds without a cell after which the ranks stop to free their memory; "
            "the next cell says so (default: %(default)s)",
        },
        **_host_flags(Session),
        ("--name",): {
            "type": variable_name,
            "default": "session",
            "help": "variable that receives the Session (default: %(default)s)",
        },
    }
    description = "Start live ranks: torchrun processes that stay up between cells."
    return _run_parser("%ranks start", description, Session, extra)


def cell_parser() -> MagicParser:
    """The flags of a `%%ranks` cell."""
    parser = MagicParser(
        prog="%%ranks", add_help=False, description="Run the cell on the live ranks."
    )
    parser.add_argument(
        "--on",
        type=_rank_list,
        default=None,
        help="only these ranks, e.g. --on 0 or --on 0,2 (default: all)",
    )
    parser.add_argument(
        "--output",
        choices=OUTPUT_MODES,
        default=None,
        help=f"{MODES_HELP} (default: the session's, set by `%%ranks start --output`)",
    )
    parser.add_argument(
        "--result",
        type=variable_name,
        default="last_cell",
        help="variable that receives the CellResult (default: %(default)s)",
    )
    parser.add_argument(
        "--profile",
        metavar="NAME",
        default=None,
        help="record a torch.profiler trace of the cell on every rank as record NAME; "
        "ddp_kit.tracing.from_records(session.records, NAME) puts them side by side",
    )
    return parser  # fmt: skip


def _rank_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank list like 0 or 0,2") from None


RANKS_USAGE = """\
%ranks start [flags]   start live ranks (flags below)
%ranks stop            stop them
%ranks restart         stop and start again (fresh processes: all rank state is lost)
%ranks status          how many ranks, backend, pids, cells run
%ranks where           where each rank of the running (or last) cell is: its cell lines and
                       the torch function (ranks say so once the cell has run 2 s)
%%ranks [--on 0,2] [--output rank0] [--profile NAME]
                       run the cell on every live rank (or only those listed)
"""


class RanksMagic:
    """%ranks / %%ranks: one Session per IPython shell."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.session = None

    def __call__(self, line: str, cell: str | None = None) -> None:
        if cell is not None:
            self.cell(line, cell)
            return
        command, *rest = shlex.split(line) or ["status"]
        actions = {"start": self.start, "stop": self.stop, "restart": self.restart,
                   "status": self.status, "where": self.where}  # fmt: skip
        if command not in actions:
            raise LaunchConfigError(f"%ranks: unknown command {command!r}. Usage:\n{RANKS_USAGE}")
        if command != "start" and rest:
            raise LaunchConfigError(f"%ranks {command} takes no flags. Usage:\n{RANKS_USAGE}")
        actions[command](rest)

    def start(self, argv: list[str]) -> None:
        from .session import Session

        args = session_parser().parse_args(argv)
        if self.session is not None and self.session.running:
            raise LaunchConfigError(
                f"%ranks start: {self.session.world_size} live ranks are already running. "
                "Use %ranks restart for fresh ones, or %ranks stop first."
            )
        self.session = Session(**_options(args, "name"))
        self.namespace[args.name] = self.session
        print(
            f"[ddp_kit] {self.session.world_size} live ranks ready ({self.session.choice.backend}"
            f" on {self.session.choice.device}) in {self.session.start_seconds:.1f} s"
        )

    def stop(self, _argv: list[str]) -> None:
        if self.session is None or not self.session.running:
            print("[ddp_kit] no live ranks to stop (start them with %ranks start -n 4)")
            return
        self.session.close()
        print("[ddp_kit] live ranks stopped")

    def restart(self, _argv: list[str]) -> None:
        self._require().restart()
        print(f"[ddp_kit] {self.session.world_size} fresh live ranks ready; earlier state is gone")

    def status(self, _argv: list[str]) -> None:
        print(self.session.status() if self.session else "No live ranks: %ranks start -n 4")

    def where(self, _argv: list[str]) -> None:
        print(self.session.where() if self.session else "No live ranks: %ranks start -n 4")

    def cell(self, line: str, cell: str) -> None:
        args = cell_parser().parse_args(shlex.split(line))
        session = self._require()
        try:
            self.namespace[args.result] = session.run(
                cell, args.on, output=args.output, profile=args.profile
            )
        except SyntaxError as error:
            raise CellSyntaxError(error) from None
        except Exception as error:
            if getattr(error, "result", None) is not None:
                self.namespace[args.result] = error.result
            raise

    def _require(self):
        if self.session is None or not self.session.running:
            raise LaunchConfigError("No live ranks: start them first with `%ranks start -n 4`.")
        return self.session


def register(ipython) -> None:
    """Register %%torchrun and %ranks / %%ranks with an IPython shell."""

    def torchrun(line: str, cell: str) -> None:
        torchrun_magic(line, cell, ipython.user_ns)

    torchrun.__doc__ = torchrun_parser().format_help()
    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
    ranks_magic = RanksMagic(ipython.user_ns)

    def ranks(line: str, cell: str | None = None) -> None:
        ranks_magic(line, cell)

    ranks.__doc__ = "\n".join(
        [RANKS_USAGE, session_parser().format_help(), cell_parser().format_help()]
    )
    ipython.register_magic_function(ranks, magic_kind="line_cell", magic_name="ranks")
