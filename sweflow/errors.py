"""Domain exceptions. Every message is one line naming the file, item/row and field, and what to do;
secrets (environment values, token shapes, URL credentials) are redacted from it."""

from __future__ import annotations


class SweflowError(Exception):
    """Base of every user-facing error; the CLI prints its message on one line and exits non-zero."""

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        row: int | str | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = file
        self.row = row
        self.field = field
        self.hint = hint
        super().__init__(self.one_line())

    def __reduce__(self):
        # pickled whole (a worker process's error reaches its parent with its file, row and field)
        return (_rebuild_error, (type(self), self.args, self.__dict__.copy()))

    def one_line(self) -> str:
        parts = []
        if self.file is not None:
            parts.append(str(self.file))
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        head = ": ".join(parts)
        msg = f"{head}: {self.problem}" if head else self.problem
        if self.hint:
            msg += f" ({self.hint})"
        from .util import redact  # a message may quote a URL with credentials or a token

        return redact(" ".join(msg.split("\n")))


def _rebuild_error(cls: type[SweflowError], args: tuple, state: dict) -> SweflowError:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class ConfigError(SweflowError):
    """The configuration is invalid."""


class DatasetError(SweflowError):
    """A dataset file, revision or row is invalid or unreachable."""


class HarnessError(SweflowError):
    """The evaluation harness cannot build a script or parser for a task."""


class SandboxError(SweflowError):
    """A sandbox or template operation failed."""


class ProxyError(SweflowError):
    """The token-recording proxy rejected a request or its engine failed."""


class EvalError(SweflowError):
    """A patch evaluation failed for reasons other than the tests."""


class ProvenanceError(SweflowError):
    """A provenance record is missing or does not match its artifact."""


class TrainError(SweflowError):
    """A model preparation or training run failed."""


class SmithError(SweflowError):
    """A SWE-smith repository profile, candidate, validation run or task could not be used."""


class EmptyResultError(SweflowError):
    """A stage produced nothing usable (0 templates, 0 rows converted, 0 tasks valid) and `allow_empty`
    does not say that is expected."""
