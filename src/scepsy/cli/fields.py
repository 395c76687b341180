"""Command-line options generated from a typed request's fields
(:mod:`scepsy_place.request`): one option per field that carries a ``Flag``, its help from
the field's docstring, its default from the field's, its parsing from the flag's text form.

An option the user does not give is left out of the namespace (``argparse.SUPPRESS``), so
the request gets exactly the values given and keeps its own defaults; :func:`given_fields`
reads them back by field path, parsed.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, FINITE, NONNEGATIVE, POSITIVE, RATE, SEED, slo_flags
from scepsy.cli.util import floats, ints

# form -> argparse keyword arguments (the text forms parsed after argparse are in _PARSE)
_ARGPARSE: Mapping[str, dict[str, Any]] = {
    "text": {}, "path": {"type": Path}, "count": {"type": COUNT}, "seed": {"type": SEED},
    "positive": {"type": POSITIVE}, "nonnegative": {"type": NONNEGATIVE},
    "float": {"type": FINITE}, "rate": {"type": RATE}, "choice": {}, "switch": {"action": "store_true"},
    "negated-switch": {"action": "store_false"}, "csv-ints": {}, "csv-floats": {},
    "memory-shares": {}, "rates": {"action": "append"}, "prices": {"action": "append"},
    "latency-bounds": {"action": "append"}, "slos": {"action": "append"},
}


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def _default_text(value: Any) -> str | None:
    if value is None or value is False or value == {} or value == ():
        return None
    if isinstance(value, tuple):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_request_flags(parser: argparse.ArgumentParser, fields: Iterable[Any],
                      *, only: Iterable[str] | None = None) -> None:
    """Add an option for each of ``fields`` (:func:`scepsy_place.request.flag_fields`; with
    ``only``, those whose option is listed) to ``parser``."""
    keep = None if only is None else set(only)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in fields:
        flag = f.flag
        if keep is not None and flag.name not in keep:
            continue
        target: Any = parser
        if flag.group == "engine":
            target = groups.setdefault("engine", parser.add_argument_group(
                "engine settings (default: vLLM's)"))
        kw = dict(_ARGPARSE[flag.form])
        kw.update(dest=_dest(flag.name), default=argparse.SUPPRESS, required=f.required)
        if flag.metavar:
            kw["metavar"] = flag.metavar
        if flag.choices is not None:
            kw["choices"] = list(flag.choices())
        default = _default_text(f.default)
        help_text = f.help
        if default is not None and flag.form not in ("negated-switch",) and \
                "default" not in help_text:
            help_text += f" (default {default})"
        kw["help"] = help_text.replace("%", "%%")
        target.add_argument(flag.name, **kw)
        for extra in flag.also:  # --tpot-slo beside --ttft-slo: read together (form slos)
            target.add_argument(extra, dest=_dest(extra), action="append",
                                default=argparse.SUPPRESS, metavar=flag.also_metavar,
                                help=flag.also_help.replace("%", "%%"))


def _memory_shares(text: str) -> tuple[float, ...] | None:
    """``--memory-shares``: ``tied`` (None), ``tenths`` or a comma-separated grid."""
    from scepsy_opt.planning.problem import TENTHS

    if text.strip() == "tied":
        return None
    if text.strip() == "tenths":
        return TENTHS
    return tuple(floats(text, "--memory-shares"))


def given_fields(args: argparse.Namespace, fields: Iterable[Any],
                 parsers: Mapping[str, Callable[[Any], Any]]) -> dict[tuple[str, ...], Any]:
    """The values of the options given in ``args``, parsed by their form, by field path.
    ``parsers``: the CLI's parsers of the repeated forms (``rates``, ``prices``,
    ``latency-bounds``), which return the field's value (``latency-bounds``: the mean and
    the percentile bounds, set on ``("objective", "latency_bound_s")`` and the field)."""
    out: dict[tuple[str, ...], Any] = {}
    for f in fields:
        flag = f.flag
        dests = [_dest(n) for n in (flag.name, *flag.also)]
        if not any(hasattr(args, d) for d in dests):
            continue
        value: Any = getattr(args, dests[0], None)
        form = flag.form
        if form == "csv-ints":
            value = tuple(ints(value, flag.name))
        elif form == "csv-floats":
            value = tuple(floats(value, flag.name))
        elif form == "memory-shares":
            value = _memory_shares(value)
        elif form == "slos":
            value = slo_flags(getattr(args, dests[0], []), getattr(args, dests[1], []))
        elif form == "latency-bounds":
            mean, value = parsers[form](value)
            if mean is not None:
                out[("objective", "latency_bound_s")] = mean
        elif form in parsers:
            value = parsers[form](value)
        if value is None and form in ("rates", "prices", "latency-bounds", "slos"):
            continue
        out[f.path] = value
    return out
