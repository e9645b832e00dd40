"""The worker script torchrun runs on every rank: code text, a .py file or a function."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path

from .errors import LaunchConfigError

Worker = str | Path | Callable[[], object]


def worker_source(worker: str | Callable[[], object]) -> str:
    """The Python source of a worker given as code text or as a function."""
    if callable(worker):
        return _function_source(worker)
    if not isinstance(worker, str) or not worker.strip():
        raise LaunchConfigError("The worker is empty: give it code, a .py file or a function.")
    source = textwrap.dedent(worker)
    try:
        compile(source, "<worker>", "exec")
    except SyntaxError as err:
        raise LaunchConfigError(f"The worker code has a syntax error: {err}") from err
    return source


def write_script(directory: Path, worker: Worker) -> Path:
    """The script to run: an existing .py file as it is, else the code written to worker.py."""
    if _is_path(worker):
        return _existing_file(Path(worker)).resolve()
    path = Path(directory) / "worker.py"
    path.write_text(worker_source(worker))
    return path


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        raise LaunchConfigError(
            f"Worker file {str(path)!r} does not exist: pass an existing .py file, "
            "the worker code as a string, or a function."
        )
    return path


def _is_path(worker: Worker) -> bool:
    """A Path, or a one-line string naming a .py file (rather than code)."""
    if isinstance(worker, Path):
        return True
    text = worker.strip() if isinstance(worker, str) else ""
    return "\n" not in text and text.endswith(".py") and " " not in text


def _function_source(fn: Callable[[], object]) -> str:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise LaunchConfigError(
            f"Cannot read the source of {fn!r}; pass a function defined in a file or "
            "notebook cell, or the worker code as a string."
        ) from err
    return f"{source}\n\nif __name__ == '__main__':\n    {fn.__name__}()\n"
