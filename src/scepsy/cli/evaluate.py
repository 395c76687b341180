"""What ``scepsy predict`` and ``scepsy simulate`` share: their input flags and the serving
engine's settings (the engine fields of the plan request)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import COUNT, RATE, SEED
from scepsy.cli.util import naming as _naming


def _engine_fields() -> tuple[Any, ...]:
    from scepsy_place.request import flag_fields

    return tuple(f for f in flag_fields() if f.path[0] == "engine")


def _engine_args(cmd: argparse.ArgumentParser) -> None:
    """The serving engine's settings, as vLLM names them (predict, simulate): the engine
    fields of the plan request (:class:`scepsy_place.request.Engine`)."""
    from scepsy.cli.fields import add_request_flags

    add_request_flags(cmd, _engine_fields())


def _engine(args: argparse.Namespace) -> Any:
    """The MemoryPolicy of the engine flags, or None when none is given."""
    from scepsy.cli.fields import given_fields
    from scepsy_place.request import Engine, flag_names

    given = {path[-1]: v for path, v in given_fields(args, _engine_fields(), {}).items()}
    with _naming(flag_names()):
        return Engine.checked(given).memory_policy()


def _evaluate_args(cmd: argparse.ArgumentParser) -> None:
    """The options predict and simulate share."""
    from scepsy.api import DEFAULT_TRACE_REQUESTS

    cmd.add_argument("--workflow", type=Path, required=True,
                     help="workflow, workload or rate workload (kind: rates) YAML")
    cmd.add_argument("--allocation", type=Path, required=True, help="allocation YAML/JSON")
    cmd.add_argument("--rate", type=RATE,
                     help="total arrival rate, req/s (split over a workload's weights); "
                     "optional for a rate workload: its rates, rescaled to this total if given")
    cmd.add_argument("--trace", type=Path, help="recorded trace (default: generated)")
    cmd.add_argument("--trace-requests", type=COUNT, default=DEFAULT_TRACE_REQUESTS,
                     help="requests per workflow of the generated trace (default %(default)s)")
    cmd.add_argument("--curves", type=Path, help="fitted curves (measured curves win)")
    cmd.add_argument("--overheads", type=Path, help="engine overheads calibration YAML/JSON "
                     "(scepsy profile calibrate; default: none, optimistic)")
    cmd.add_argument("--catalog", type=Path, help="YAML catalog extending the bundled one")
    cmd.add_argument("--seed", type=SEED, default=0)
    cmd.add_argument("--json", action="store_true")
    _engine_args(cmd)


_EVAL_FLAGS = {"seed": "--seed", "trace_requests": "--trace-requests", "rate": "--rate",
               "requests": "--requests", "overheads": "--overheads", "arrivals": "--arrivals",
               "time_scale": "--time-scale"}
