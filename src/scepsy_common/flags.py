"""Command-line options declared on the fields of a typed request (pydantic models).

A request field that the command line sets carries a :class:`Flag` in its ``Annotated``
metadata: the option's name, how its text is parsed (:data:`FORMS`), its metavar and help
group. :func:`fields_with_flags` lists them as :class:`FlagField` (the field's path in the
request, its default, whether it is required and its docstring as help), which the command
line turns into options (``scepsy.cli.fields``): one declaration gives the type, the choices,
the default and the help of both the library's field and the CLI's option.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class Flag:
    """How a request field appears on the command line: the option ``name`` (or several, for a
    field the CLI reads from more than one option), its ``metavar``, and its text ``form``, one
    of :data:`FORMS` (how the CLI parses the text into the field's value)."""

    name: str
    form: str = "text"
    metavar: str | None = None
    also: tuple[str, ...] = ()  # further options of the same field (--tpot-slo beside --ttft-slo)
    group: str | None = None  # the help section
    choices: Callable[[], tuple[str, ...]] | None = None  # form "choice": the values
    also_metavar: str | None = None  # the further options' metavar and help
    also_help: str = ""


FORMS = ("text", "path", "count", "seed", "positive", "nonnegative", "float", "rate", "choice",
         "switch",
         "negated-switch", "csv-ints", "csv-floats", "memory-shares", "rates", "prices",
         "latency-bounds", "slos")
"""The text forms of :class:`Flag`: ``switch`` is a flag that sets True, ``negated-switch`` one
that sets False (``--no-improve``); ``rates``, ``prices`` and ``latency-bounds`` repeat
(``NAME=VALUE`` entries); ``slos`` reads ``--ttft-slo`` and ``--tpot-slo``."""



@dataclass(frozen=True)
class FlagField:
    """A request field that has a command-line option: its path in the request (``("search",
    "tps")``), its :class:`Flag`, its default and its help text."""

    path: tuple[str, ...]
    flag: Flag
    default: Any
    required: bool
    help: str


def fields_with_flags(models: Iterable[tuple[tuple[str, ...], type[BaseModel]]]
                      ) -> tuple[FlagField, ...]:
    """Every field of ``models`` (each with its path prefix in the request) that carries a
    :class:`Flag`, once per option, in the order given."""
    out: dict[str, FlagField] = {}
    for prefix, model in models:
        for name, info in model.model_fields.items():
            flag = next((m for m in info.metadata if isinstance(m, Flag)), None)
            if flag is None or flag.name in out:
                continue
            if flag.form not in FORMS:
                raise ValueError(f"{model.__name__}.{name}: unknown flag form {flag.form!r}")
            out[flag.name] = FlagField((*prefix, name), flag,
                                       None if info.is_required() else info.get_default(
                                           call_default_factory=True),
                                       info.is_required(),
                                       " ".join((info.description or "").split()))
    return tuple(out.values())
