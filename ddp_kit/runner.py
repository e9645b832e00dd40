"""`python -m ddp_kit.runner SCRIPT ARGS`: what torchrun starts on every rank.

It prepares the worker (error reports, collective timeout, clean exit), then runs SCRIPT as
__main__, so tracebacks point at the script's own line numbers.
"""

import runpy
import sys

from .worker import bootstrap


def main() -> None:
    """Bootstrap this rank, then run the worker script with its own argv."""
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    bootstrap(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
