"""The script torchrun runs on every rank, from code text, a .py file or a function."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from pathlib import Path

from ..shared.contract import SCRIPT_FILE
from ..shared.errors import LaunchConfigError

Script = str | Path | Callable[[], object]
"""Code text, the path of an existing .py file, or a function taking no arguments."""


def script_source(script: str | Callable[[], object]) -> str:
    """The Python source of a script given as code text or as a function."""
    if callable(script):
        return _function_source(script)
    if not isinstance(script, str) or not script.strip():
        raise LaunchConfigError("The script is empty: give it code, a .py file or a function.")
    source = textwrap.dedent(script)
    try:
        compile(source, "<script>", "exec")
    except SyntaxError as err:
        raise LaunchConfigError(f"The script has a syntax error: {err}") from err
    return source


def write_script(directory: Path, script: Script) -> Path:
    """The file to run: an existing .py file as it is, else the code written to
    the run directory's script file (contract.SCRIPT_FILE)."""
    if _is_path(script):
        return _existing_file(Path(script)).resolve()
    path = Path(directory) / SCRIPT_FILE
    path.write_text(script_source(script))
    return path


def _existing_file(path: Path) -> Path:
    if not path.is_file():
        raise LaunchConfigError(
            f"Script file {str(path)!r} does not exist: pass an existing .py file, "
            "the code as a string, or a function."
        )
    return path


def _is_path(script: Script) -> bool:
    """A Path, or a one-line string naming a .py file (rather than code)."""
    if isinstance(script, Path):
        return True
    text = script.strip() if isinstance(script, str) else ""
    return "\n" not in text and text.endswith(".py") and " " not in text


def _function_source(fn: Callable[[], object]) -> str:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as err:
        raise LaunchConfigError(
            f"Cannot read the source of {fn!r}; pass a function defined in a file or "
            "notebook cell, or the code as a string."
        ) from err
    return f"{source}\n\nif __name__ == '__main__':\n    {fn.__name__}()\n"
