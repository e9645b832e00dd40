"""The worker script torchrun runs on every rank: code text, a .py file or a function."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path

from .errors import LaunchConfigError

Worker = str | Path | Callable[[], object]


def worker_source(worker: Worker) -> str:
    """The Python source a worker runs, from code text, a .py file or a function."""
    if callable(worker):
        return _function_source(worker)
    if isinstance(worker, Path) or (isinstance(worker, str) and _looks_like_path(worker)):
        return _existing_file(Path(worker)).read_text()
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
    if isinstance(worker, Path) or (isinstance(worker, str) and _looks_like_path(worker)):
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


def _looks_like_path(text: str) -> bool:
    return "\n" not in text and text.strip().endswith(".py") and " " not in text.strip()


def _function_source(fn: Callable[[], object]) -> str:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise LaunchConfigError(
            f"Cannot read the source of {fn!r}; pass a function defined in a file or "
            "notebook cell, or the worker code as a string."
        ) from err
    return f"{source}\n\nif __name__ == '__main__':\n    {fn.__name__}()\n"
