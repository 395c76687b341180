"""Errors raised for bad user input.

Every user-facing mistake (a malformed file, an unknown GPU, a negative latency) becomes an
:class:`InputError` that names the source (file or argument), the field and what was expected.
The CLI turns it into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from a user: a file, a field and what was expected."""

    def __init__(self, source: str, field: str, expected: str, got: object = None) -> None:
        self.source = source
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{source}: {field}" if field else source
        tail = f" (got {got!r})" if got is not None else ""
        super().__init__(f"{where}: expected {expected}{tail}")


class UnknownEntryError(InputError, KeyError):
    """A name (GPU, model, TP degree) that the catalog or a fitted model does not know."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return ValueError.__str__(self)
