"""The errors ddp_kit raises: each one says what went wrong and how to fix it."""

from __future__ import annotations


class DDPKitError(Exception):
    """Base class of every ddp_kit error."""


class LaunchConfigError(DDPKitError, ValueError):
    """Bad arguments, caught before any process starts."""


class WorkerError(DDPKitError, RuntimeError):
    """A rank failed: the message names it and carries its traceback."""

    def __init__(self, message: str, result: object) -> None:
        super().__init__(message)
        self.result = result


class LaunchTimeout(WorkerError):
    """The whole run took longer than the launch timeout and was stopped."""


class RecordError(DDPKitError, ValueError):
    """A record file is missing or corrupt, or a record cannot be stacked."""
