"""The magics: %%torchrun (a one-shot torchrun job) and %ranks / %%ranks (live ranks).

Flags mirror launch()'s and Session()'s keyword arguments, and their defaults are read from
those signatures (one source of defaults); the help (`%%torchrun?`, `%ranks?`) is generated
from the flag definitions.
"""

from __future__ import annotations

import argparse
import inspect
import shlex
from collections.abc import Callable

from .errors import LaunchConfigError
from .launcher import launch
from .output import OUTPUT_MODES


class MagicParser(argparse.ArgumentParser):
    """argparse that raises LaunchConfigError (never sys.exit inside a kernel)."""

    def error(self, message: str) -> None:
        raise LaunchConfigError(f"{self.prog}: {message}. Usage: {self.format_usage().strip()}")


def default_of(function: Callable, name: str) -> object:
    """The default value of `function`'s parameter `name`."""
    return inspect.signature(function).parameters[name].default


def torchrun_parser() -> MagicParser:
    """The flags of %%torchrun, with launch()'s defaults."""
    parser = MagicParser(
        prog="%%torchrun",
        add_help=False,
        description="Run the cell as a script on N ranks with torchrun (a one-shot job: "
        "processes start, run the cell, and end).",
    )
    parser.add_argument(
        "-n",
        "--nproc",
        type=int,
        default=default_of(launch, "nproc"),
        help="ranks per node (default: %(default)s)",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=default_of(launch, "nnodes"),
        help="torchrun agents, as if each were a machine (default: %(default)s)",
    )
    parser.add_argument(
        "--backend",
        default=default_of(launch, "backend"),
        help="auto, gloo or nccl (default: %(default)s: nccl only with a GPU per rank)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=default_of(launch, "timeout"),
        help="seconds the whole run may take (default: %(default)s)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=default_of(launch, "collective_timeout"),
        help="seconds a collective waits for the other ranks (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        choices=OUTPUT_MODES,
        default=default_of(launch, "output"),
        help="ordered: rank 0 live, the rest in rank order at the end; live: "
        "as it comes; quiet: nothing (default: %(default)s)",
    )
    parser.add_argument(
        "--result",
        default="last_run",
        help="variable that receives the RunResult (default: %(default)s)",
    )
    return parser  # fmt: skip


def torchrun_magic(line: str, cell: str, namespace: dict) -> None:
    """Run `cell` with torchrun; store the RunResult in namespace[--result] (default last_run)."""
    args = torchrun_parser().parse_args(shlex.split(line))
    if not args.result.isidentifier():
        raise LaunchConfigError(f"%%torchrun: --result {args.result!r} is not a variable name.")
    try:
        result = launch(
            cell,
            args.nproc,
            nnodes=args.nnodes,
            backend=args.backend,
            timeout=args.timeout,
            collective_timeout=args.collective_timeout,
            output=args.output,
        )
    except Exception as error:
        if hasattr(error, "result"):
            namespace[args.result] = error.result
        raise
    namespace[args.result] = result


def session_parser() -> MagicParser:
    """The flags of `%ranks start`, with Session()'s defaults."""
    from .session import Session

    parser = MagicParser(
        prog="%ranks start",
        add_help=False,
        description="Start live ranks: torchrun processes that stay up between cells.",
    )
    parser.add_argument(
        "-n",
        "--nproc",
        type=int,
        default=default_of(Session, "nproc"),
        help="ranks per node (default: %(default)s)",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        default=default_of(Session, "nnodes"),
        help="torchrun agents, as if each were a machine (default: %(default)s)",
    )
    parser.add_argument(
        "--backend",
        default=default_of(Session, "backend"),
        help="auto, gloo or nccl (default: %(default)s)",
    )
    parser.add_argument(
        "--collective-timeout",
        type=float,
        default=default_of(Session, "collective_timeout"),
        help="seconds a collective waits for the other ranks (default: %(default)s)",
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=default_of(Session, "cell_timeout"),
        help="seconds a cell may run before its ranks are interrupted (default: %(default)s)",
    )
    parser.add_argument(
        "--output",
        choices=OUTPUT_MODES,
        default=default_of(Session, "output"),
        help="ordered, live or quiet, as for %%%%torchrun (default: %(default)s)",
    )
    parser.add_argument(
        "--name",
        default="session",
        help="variable that receives the Session (default: %(default)s)",
    )
    return parser  # fmt: skip


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
        "--result",
        default="last_cell",
        help="variable that receives the CellResult (default: %(default)s)",
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
%%ranks [--on 0,2]     run the cell on every live rank (or only those listed)
"""


class RanksMagic:
    """%ranks / %%ranks: one Session per IPython shell."""

    def __init__(self, namespace: dict) -> None:
        self.namespace = namespace
        self.session = None

    def __call__(self, line: str, cell: str | None = None) -> None:
        if cell is not None:
            self.run_cell(line, cell)
            return
        command, *rest = shlex.split(line) or ["status"]
        actions = {"start": self.start, "stop": self.stop, "restart": self.restart,
                   "status": self.status}  # fmt: skip
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
        if not args.name.isidentifier():
            raise LaunchConfigError(f"%ranks start: --name {args.name!r} is not a variable name.")
        self.session = Session(
            args.nproc,
            nnodes=args.nnodes,
            backend=args.backend,
            collective_timeout=args.collective_timeout,
            cell_timeout=args.cell_timeout,
            output=args.output,
        )
        self.namespace[args.name] = self.session
        print(
            f"[ddp_kit] {self.session.world_size} live ranks ready ({self.session.choice.backend}"
            f" on {self.session.choice.device}) in {self.session.start_seconds:.1f} s"
        )

    def stop(self, _argv: list[str]) -> None:
        if self.session is not None:
            self.session.close()
        print("[ddp_kit] live ranks stopped")

    def restart(self, _argv: list[str]) -> None:
        self._require().restart()
        print(f"[ddp_kit] {self.session.world_size} fresh live ranks ready; earlier state is gone")

    def status(self, _argv: list[str]) -> None:
        print(self.session.status() if self.session else "No live ranks: %ranks start -n 4")

    def run_cell(self, line: str, cell: str) -> None:
        args = cell_parser().parse_args(shlex.split(line))
        if not args.result.isidentifier():
            raise LaunchConfigError(f"%%ranks: --result {args.result!r} is not a variable name.")
        session = self._require()
        try:
            self.namespace[args.result] = session.run(cell, args.on)
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
