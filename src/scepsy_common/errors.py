"""Errors raised for bad user input.

Every user-facing mistake (a malformed file, an unknown GPU, a negative latency) becomes an
:class:`InputError` that names the source (file or argument), the field and what was expected.
The CLI turns it into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Annotated, Any, TypeGuard, TypeVar

from pydantic import BaseModel, StringConstraints, ValidationError

from scepsy_common.rates import RATE_EXPECTED, is_rate

M = TypeVar("M", bound=BaseModel)


class InputError(ValueError):
    """Bad input from a user: a file, a field and what was expected."""

    def __init__(self, source: str, field: str, expected: str, got: object = None) -> None:
        self.source = source
        self.field = field
        self.expected = expected
        self.got = got
        where = f"{_one_line(source)}: {_one_line(field)}" if field else _one_line(source)
        tail = f" (got {_shown(got)})" if got is not None else ""
        super().__init__(f"{where}: expected {_one_line(expected)}{tail}")


GOT_MAX = 80
"""The most characters of a bad value an :class:`InputError` message quotes; a longer one is
shown as its first :data:`GOT_MAX` characters and its length (the value itself stays in
``InputError.got``)."""


def _shown(got: object) -> str:
    """``repr(got)``, a long string or other value cut to its first :data:`GOT_MAX` characters
    followed by ``... (N characters)``."""
    if isinstance(got, int) and got.bit_length() > 4 * GOT_MAX:  # (repr may pass Python's
        return f"an integer of about {got.bit_length() * 0.30103:.0f} digits"  # digit limit)
    text = got if isinstance(got, str) else repr(got)
    if len(text) <= GOT_MAX:
        return repr(got)
    head = repr(text[:GOT_MAX]) if isinstance(got, str) else text[:GOT_MAX]
    return f"{head}... ({len(text)} characters)"


def _one_line(text: str) -> str:
    """``text`` with control characters (newlines, tabs, escapes) written as escapes, so that
    a message stays one line whatever names it quotes."""
    text = str(text)
    return text if text.isprintable() else "".join(
        c if c.isprintable() else repr(c)[1:-1] for c in text)


_PART = r"[A-Za-z0-9_][A-Za-z0-9_.+:-]*"
NAME_PATTERN = rf"^{_PART}(?:/{_PART})*$"
"""Names in the project's files (workflows, LLMs, tools, GPUs, nodes, racks): one or more parts
separated by single ``/``, each part a letter, digit or ``_`` followed by letters, digits and
``_ . + : -``; at most :data:`NAME_MAX` characters in all. So no spaces, quotes, shell
metacharacters or control characters, and no part ``.`` or ``..``, empty part or leading or
trailing ``/``: a name used in a file or folder name stays inside its folder."""
NAME_MAX = 128
NAME_EXPECTED = (f"a name of 1 to {NAME_MAX} characters: ASCII letters, digits and _ . + : - "
                 "in parts separated by single /, each part starting with an ASCII letter, "
                 "digit or _ "
                 "(e.g. meta-llama/Llama-3.1-8B)")
_NAME_RE = re.compile(NAME_PATTERN)
_RULES: dict[str, str] = {}
"""A pattern -> what a string matching it is, in words (:func:`described`)."""


def described(pattern: str, expected: str) -> str:
    """``pattern``, recorded as meaning ``expected``: a pydantic field constrained by it
    (``StringConstraints(pattern=described(P, WHAT))``) fails with ``expected`` in its message
    (:func:`from_validation`): one rule, one message."""
    if _RULES.setdefault(pattern, expected) != expected:
        raise ValueError(f"pattern {pattern!r} already means {_RULES[pattern]!r}")
    return pattern


def expectation(pattern: str) -> str:
    """What a string matching ``pattern`` is, in words (as :func:`described`; else the pattern
    itself)."""
    return _RULES.get(pattern, f"a string matching {pattern}")


Name = Annotated[str, StringConstraints(pattern=described(NAME_PATTERN, NAME_EXPECTED),
                                        max_length=NAME_MAX)]
"""A pydantic string field holding a :data:`NAME_PATTERN` name."""


def is_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a :data:`NAME_PATTERN` name of at most :data:`NAME_MAX` characters."""
    return isinstance(value, str) and len(value) <= NAME_MAX and \
        _NAME_RE.fullmatch(value) is not None


def check_name(value: object, source: str, field: str) -> str:
    """``value`` if it is a :data:`NAME_PATTERN` name, else an :class:`InputError`."""
    if not is_name(value):
        raise InputError(source, field, NAME_EXPECTED, value)
    return value


class UnknownEntryError(InputError, KeyError):
    """A name (GPU, model, TP degree) that the catalog or a fitted model does not know."""

    def __str__(self) -> str:  # KeyError would add quotes around the message
        return ValueError.__str__(self)


class UncoveredInstanceError(UnknownEntryError):
    """A latency model was asked about an instance ``(model, gpu, tp)`` it does not cover.

    Every latency model raises this one error, with one message shape::

        SOURCE: (model, gpu, tp): expected WHAT IT COVERS (got 'MODEL@GPU tp=TP')

    and the instance in ``model``, ``gpu`` and ``tp``; ``covers(model, gpu, tp)`` is False
    exactly for the instances that raise it.
    """

    FIELD = "(model, gpu, tp)"

    def __init__(self, source: str, model: str, gpu: str, tp: int, expected: str) -> None:
        super().__init__(source, self.FIELD, expected, f"{model}@{gpu} tp={tp}")
        self.model = model
        self.gpu = gpu
        self.tp = tp

    def __reduce__(self) -> tuple:
        return (type(self), (self.source, self.model, self.gpu, self.tp, self.expected))


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
           "less_than_equal": "<="}
_SIMPLE = {
    "missing": "a value (field is missing)", "int_type": "an integer",
    "int_from_float": "an integer", "int_parsing": "an integer", "float_type": "a number",
    "float_parsing": "a number", "finite_number": "a finite number", "bool_type": "true or false",
    "string_type": "a string", "string_too_short": "a non-empty string", "dict_type": "a mapping",
    "list_type": "a list", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "dataclass_type": "a mapping", "is_instance_of": "a mapping",
    "enum": "one of the listed values",
}
_KINDS = {dict: "a mapping", list: "a list", type(None): "nothing (null)"}


def validated(model: type[M], raw: Any, source: str, prefix: str = "",
              allowed: Callable[[tuple[Any, ...]], Iterable[str]] | None = None) -> M:
    """``model.model_validate(raw)``, its first error turned into an :class:`InputError`
    (:func:`from_validation`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise from_validation(exc, source, prefix, allowed) from None


def loc_path(loc: Iterable[Any]) -> str:
    """A field's place as every message writes it: ``pools[0].gpu`` (a list index in brackets,
    mapping keys joined by dots; pydantic's ``[key]`` marker dropped)."""
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def from_validation(
    exc: ValidationError,
    source: str,
    prefix: str = "",
    allowed: Callable[[tuple[Any, ...]], Iterable[str]] | None = None,
) -> InputError:
    """Turn pydantic's first error into an :class:`InputError` naming file, field and expectation.

    ``prefix`` goes before the field path (e.g. ``"line 3: "``); ``allowed(loc)`` may list the
    valid field names for an unknown-field error at ``loc``.
    """
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    field = prefix + (loc_path(loc) or "top level")
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        names = list(allowed(loc)) if allowed else []
        expected = "no such field (unknown field)" + (f"; allowed: {', '.join(names)}" if names else "")
    elif kind in _BOUNDS:
        bound = next(iter(ctx.values()), "")
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        expected = f"a number {_BOUNDS[kind]} {bound}"
    elif kind == "literal_error":
        expected = f"one of {ctx.get('expected', '')}"
    elif kind in ("too_short", "too_long"):
        n = ctx.get("min_length" if kind == "too_short" else "max_length", "")
        word = "least" if kind == "too_short" else "most"
        what = ("a mapping", "entr", "ies", "y") if isinstance(err.get("input"), dict) else (
            "a list", "item", "s", "")
        expected = f"{what[0]} of at {word} {n} {what[1]}{what[2] if n != 1 else what[3]}"
    elif kind == "string_pattern_mismatch":
        expected = expectation(str(ctx.get("pattern", "")))
    elif kind == "string_too_long":
        expected = f"a string of at most {ctx.get('max_length', '')} characters"
    elif kind == "value_error":
        expected = str(ctx.get("error", err["msg"]))
    elif loc and loc[-1] == "[key]" and kind not in ("string_pattern_mismatch", "string_too_long"):
        expected = "a name (a string key)"
    else:
        expected = _SIMPLE.get(kind, str(err["msg"]).lower())
    quiet = kind in ("missing", "extra_forbidden", "value_error")  # the input says nothing more
    got = None if quiet else err.get("input")
    if isinstance(got, dict | list):
        got = f"{_KINDS[type(got)]} of {len(got)} item{'s' if len(got) != 1 else ''}"
    elif got is None and not quiet:
        got = _KINDS[type(None)]
    return InputError(source, field, expected, got)


def check_rate(value: object, source: str, field: str, why: str = "") -> float:
    """``value`` as a float if it is a rate (:func:`scepsy_common.rates.is_rate`), else an
    :class:`InputError` naming ``source`` and ``field`` and saying
    :data:`~scepsy_common.rates.RATE_EXPECTED` followed by ``why`` (e.g. how the value came
    about)."""
    if not is_rate(value):
        raise InputError(source, field, RATE_EXPECTED + why, value)
    return float(value)  # type: ignore[arg-type]


def key_once(seen: dict[str, str], key: str, value: str, source: str) -> None:
    """Record ``key`` of a repeatable ``KEY=VALUE`` option (``--model``, ``--upstream-for``,
    ``--engine-option``) in ``seen``; an :class:`InputError` naming the option
    and the key when it was given before, since only one value can count (the last would
    silently win)."""
    if key in seen:
        raise InputError(source, key, f"{key!r} once (given {seen[key]!r}, then {value!r}: "
                         "only one value can count)")
    seen[key] = value
