"""The errors ddp_kit raises: each one says what went wrong and how to fix it."""

from __future__ import annotations


class DDPKitError(Exception):
    """Base class of every ddp_kit error."""


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


class SessionError(DDPKitError, RuntimeError):
    """The live ranks could not start, or are gone; the message says what to do."""


class RecordError(DDPKitError, ValueError):
    """A record file is missing or corrupt, or a record cannot be stacked."""
