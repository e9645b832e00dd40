"""The errors ddp_kit raises: each one says what went wrong and how to fix it."""

from __future__ import annotations

import traceback


class DDPKitError(Exception):
    """Base class of every ddp_kit error. In a notebook, IPython shows only its message (via
    _render_traceback_, as ipyparallel does): the kit's own frames would say nothing to a
    student."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class LaunchConfigError(DDPKitError, ValueError):
    """Bad arguments, caught before any process starts."""


class WorkerError(DDPKitError, RuntimeError):
    """A rank failed: the message names it and carries its traceback.

    In a notebook, IPython shows `rendered` (via _render_traceback_): the rank's own traceback
    with the cell's line numbers, and none of the kit's frames.
    """

    def __init__(self, message: str, result: object, rendered: list[str] | None = None) -> None:
        super().__init__(message)
        self.result = result
        self.rendered = rendered

    def _render_traceback_(self) -> list[str]:
        return self.rendered or [f"{type(self).__name__}: {self}"]


class LaunchTimeout(WorkerError):
    """The whole run took longer than the launch timeout and was stopped."""


class CellError(WorkerError):
    """A cell raised on one or more live ranks; the session is still running."""


class CellSyntaxError(DDPKitError):
    """A %%ranks cell that is not valid Python; shown as Python shows a syntax error."""

    def __init__(self, error: SyntaxError) -> None:
        super().__init__(str(error))
        self.rendered = traceback.format_exception_only(type(error), error)

    def _render_traceback_(self) -> list[str]:
        return [line.rstrip("\n") for line in self.rendered]


class Interrupted(KeyboardInterrupt):
    """A launch or a live cell stopped by the stop button (the kernel's interrupt); the message
    says what became of the ranks. A KeyboardInterrupt, not a DDPKitError, so that
    `except Exception` does not swallow it."""

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


class SessionError(DDPKitError, RuntimeError):
    """The live ranks could not start, or are gone; the message says what to do."""


class RecordError(DDPKitError, ValueError):
    """A record file is missing or corrupt, or a record cannot be stacked."""
