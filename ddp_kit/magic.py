"""The %%torchrun cell magic: the cell body becomes the worker script of a real torchrun run."""

from __future__ import annotations

import argparse
import shlex

from .errors import LaunchConfigError
from .launcher import launch
from .output import OUTPUT_MODES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # never sys.exit inside a kernel
        raise LaunchConfigError(f"%%torchrun: {message}. Usage: {self.format_usage().strip()}")


def _parser() -> _Parser:
    parser = _Parser(prog="%%torchrun", add_help=False)
    parser.add_argument("-n", "--nproc", type=int, default=2, help="ranks per node")
    parser.add_argument("--nnodes", type=int, default=1, help="torchrun agents (nodes)")
    parser.add_argument("--backend", default="auto", help="auto, gloo or nccl")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for the run")
    parser.add_argument("--collective-timeout", type=float, default=60.0)
    parser.add_argument("--output", choices=OUTPUT_MODES, default="ordered")
    parser.add_argument("--result", default="last_run", help="variable for the RunResult")
    return parser


def torchrun_magic(line: str, cell: str, namespace: dict) -> None:
    """Run `cell` with torchrun; store the RunResult in namespace[--result] (default last_run)."""
    args = _parser().parse_args(shlex.split(line))
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
        """%%torchrun [-n N] [--backend auto|gloo|nccl] [--timeout S] [--result NAME]"""
        torchrun_magic(line, cell, ipython.user_ns)

    ipython.register_magic_function(torchrun, magic_kind="cell", magic_name="torchrun")
