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


def print_document(doc: dict[str, Any], as_json: bool, workflow_columns: Sequence[str],
                   llm_columns: Sequence[str]) -> None:
    """``doc`` (per workflow and per LLM figures) as JSON, or as two tables of the columns
    given."""
    import json

    from scepsy.cli.util import json_float, print_rows

    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=json_float))
        return
    print_rows([{"workflow": w, **o} for w, o in doc["workflows"].items()],
               ["workflow", *workflow_columns])
    print()
    print_rows([{"llm": m, **o} for m, o in doc["llms"].items()], ["llm", *llm_columns])
