"""What ``scepsy predict`` and ``scepsy simulate`` share: options generated from their
requests' fields (:mod:`scepsy.evaluation`) and the request read back from the options."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from scepsy.cli.util import naming


def add_evaluation_flags(cmd: argparse.ArgumentParser, fields: Sequence[Any]) -> None:
    """One option per request field with a flag (the engine's in their own group), and
    ``--json``."""
    from scepsy.cli.fields import add_request_flags

    add_request_flags(cmd, fields)
    cmd.add_argument("--json", action="store_true", help="print the figures as JSON")


def evaluation_request(args: argparse.Namespace, cls: type, fields: Sequence[Any]) -> Any:
    """The request ``cls`` of the options given (an invalid one: a usage error naming the
    option)."""
    from scepsy.cli.fields import given_fields
    from scepsy.evaluation import request_of
    from scepsy_place.request import request_data

    given = given_fields(args, fields, {})
    with naming(option_names(fields)):
        return request_of(cls, request_data(given))


def option_names(fields: Sequence[Any]) -> dict[str, str]:
    """Each request field (its last name) -> its option, for error messages."""
    return {f.path[-1]: f.flag.name for f in fields}
