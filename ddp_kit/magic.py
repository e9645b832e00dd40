"""The %%torchrun cell magic: the cell body becomes the script of a real torchrun run.

Flags mirror launch()'s keyword arguments, and their defaults are read from launch()'s
signature (one source of defaults); the help text (`%%torchrun?`) is generated from them.
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


def register(ipython) -> None:
    """Register %%torchrun with an IPython shell."""

    def torchrun(line: str, cell: str) -> None:
        torchrun_magic(line, cell, ipython.user_ns)

    torchrun.__doc__ = torchrun_parser().format_help()
    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
