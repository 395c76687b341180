"""``scepsy replan``: re-plan a running plan after events (a node failed, a rack drained, a
workflow's load changed) and say which replicas are kept, moved, started and stopped
(docs/incremental.md).

Parsing and printing only; the work is :func:`scepsy_place.formulations.incremental.replan`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scepsy.cli.argtypes import NONNEGATIVE

HELP = ("re-plan a running plan.json after events (node failed, rack drained, load changed): "
        "what is kept, moved, started and stopped")

EXIT_UNPLACED = 1  # no placed plan after the events (not enough GPUs left, or not placed)
EXIT_TIME_LIMIT = 3

REQUEST_FLAGS = ("--formulation", "--placer", "--shares", "--tp", "--max-utilisation",
                 "--time-limit", "--trace", "--trace-requests", "--curves", "--overheads",
                 "--catalog", "--seed")
"""The options replan shares with plan: fields of the plan request (scepsy_place.request)."""
_OWN_FLAGS = {"move_cost_s": "--move-cost", "change_penalty_s": "--change-penalty",
              "targets": "--plan"}


def add_replan_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``replan`` to a ``scepsy`` sub-command set; returns its parser."""
    return add_arguments(subparsers.add_parser("replan", help=HELP))


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """:func:`add_replan_parser` under the name ``scepsy.cli`` calls for registered modules."""
    return add_replan_parser(subparsers)


def add_arguments(cmd: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``scepsy replan`` on ``cmd``; sets ``func``."""
    from scepsy.cli.fields import add_request_flags
    from scepsy_place.formulations.incremental import DEFAULT_CHANGE_PENALTY_S, DEFAULT_MOVE_COST_S
    from scepsy_place.request import flag_fields

    cmd.add_argument("--plan", type=Path, required=True,
                     help="the running plan.json (scepsy plan --out, or an earlier replan)")
    cmd.add_argument("--workflow", type=Path, required=True,
                     help="the workflow, workload or rate workload YAML the plan was made for")
    cmd.add_argument("--cluster", type=Path,
                     help="cluster YAML/JSON the plan runs on (default: the plan's own nodes)")
    cmd.add_argument("--event", action="append", required=True,
                     metavar="node-failed=NODE|rack-drained=RACK|load=WORKFLOW*F|load=WORKFLOW=RATE",
                     help="what happened (repeat the flag for several, applied in order)")
    cmd.add_argument("--move-cost", type=NONNEGATIVE, default=DEFAULT_MOVE_COST_S, metavar="S",
                     help="objective seconds per replica moved (default %(default)s)")
    cmd.add_argument("--change-penalty", type=NONNEGATIVE, default=DEFAULT_CHANGE_PENALTY_S,
                     metavar="S", help="objective seconds per replica started or stopped "
                     "(default %(default)s)")
    # the search and input options a plan takes, generated from the plan request's fields
    add_request_flags(cmd, flag_fields(), only=REQUEST_FLAGS)
    cmd.add_argument("--out", type=Path, default=Path("plan.json"),
                     help="the new plan.json (default %(default)s; may be --plan itself)")
    cmd.add_argument("--no-timings", action="store_true",
                     help="leave wall-clock timings out of the new plan.json")
    cmd.add_argument("--json", action="store_true",
                     help="print the report (kept, moved, started, stopped) as JSON")
    cmd.set_defaults(func=cmd_replan)
    return cmd


def _running(path: Path) -> tuple[dict[str, Any], Any]:
    """(raw plan.json, its running allocation and placement): a valid plan.json with a placed
    plan (:func:`~scepsy_serve.launch.planfile.require_placed`, as ``scepsy launch`` reads
    it)."""
    from scepsy_common.files import read_json
    from scepsy_place.formulations.incremental import running_from_document
    from scepsy_serve.launch.planfile import parse_plan, require_placed

    raw = read_json(path, "plan.json file (scepsy plan --out)")
    require_placed(parse_plan(raw, str(path)), str(path))
    return raw, running_from_document(raw, str(path))


def _topology(raw: dict[str, Any], cluster: Path | None, source: str) -> Any:
    from scepsy_place.packing.topology import load_topology, parse_topology

    if cluster is not None:
        return load_topology(cluster)
    return parse_topology(raw.get("topology") or raw["cluster"], source)


@dataclass(frozen=True)
class RunningProblem:
    """A running plan rebuilt as a planning problem (``scepsy replan``, ``scepsy control``): the
    request of the command's options, the raw plan.json, its running allocation and placement,
    the topology and the problem."""

    request: Any
    raw: dict[str, Any]
    running: Any
    topology: Any
    problem: Any


def running_problem(args: argparse.Namespace, flags: dict[str, str],
                    request_flags: tuple[str, ...] = REQUEST_FLAGS) -> RunningProblem:
    """The plan request of ``args``' options among ``request_flags`` (errors named by
    ``flags``), with the
    running plan's (``--plan``) cluster (or ``--cluster``), targets and allocation as its
    inputs, and the problem it gives. The caller holds the catalog of the request's inputs."""
    from scepsy import api
    from scepsy.cli.fields import given_fields
    from scepsy.cli.util import naming
    from scepsy_place.request import PlanRequest, flag_fields, request_data

    with naming(flags):
        given = given_fields(args, [f for f in flag_fields() if f.flag.name in request_flags],
                             {})
        req = PlanRequest.of(request_data({("inputs", "workflow"): args.workflow,
                                           ("inputs", "cluster"): args.plan, **given}))
    with api.using_catalog(req.inputs.catalog), naming(flags):
        raw, running = _running(args.plan)
        topology = _topology(raw, args.cluster, str(args.plan))
        inputs = req.inputs.model_copy(update={"cluster": topology,
                                               "targets": dict(raw["targets"]),
                                               "current": running.allocation})
        req = req.model_copy(update={"inputs": inputs})
        problem, topology = api.problem_of(req, inputs.targets)
    return RunningProblem(req, raw, running, topology, problem)


def cmd_replan(args: argparse.Namespace) -> int:
    """Run ``scepsy replan``: read, re-plan, write the new plan.json, print the report."""
    from scepsy import api
    from scepsy.cli.util import UsageError, check_out, naming, print_rows, wrote_note
    from scepsy_common.errors import InputError
    from scepsy_opt.planning.problem import Deadline
    from scepsy_place.formulations.incremental import parse_event, replan
    from scepsy_place.request import flag_names
    from scepsy_profile.catalog import catalog_in_force
    from scepsy_serve.launch.planfile import write_plan_file

    check_out(args.out)
    events = []
    for text in args.event:
        try:
            events.append(parse_event(text, "--event"))
        except InputError as exc:
            raise UsageError(f"--event: {exc.field}: expected {exc.expected} "
                             f"(got {text!r})") from None
    flags = {**flag_names(), **_OWN_FLAGS}
    rp = running_problem(args, flags)
    req, running, problem, topology = rp.request, rp.running, rp.problem, rp.topology
    search, placer = req.search, req.placement.placer
    with api.using_catalog(req.inputs.catalog), naming(flags):
        deadline = Deadline.after(search.time_limit_s)
        with catalog_in_force(problem.catalog):
            try:
                res = replan(problem, topology, running, events, move_cost_s=args.move_cost,
                             change_penalty_s=args.change_penalty, deadline=deadline,
                             policy=placer, formulation=search.formulation)
            except InputError as exc:
                if exc.source == "event":
                    raise UsageError(f"--event: {exc.field}: expected {exc.expected} "
                                     f"(got {exc.got!r})") from None
                if exc.source == "running plan" and args.cluster is not None \
                        and exc.field == "placement":
                    raise InputError("--cluster", "", f"the cluster {args.plan} runs on (its "
                                     "replicas do not fit this one; omit --cluster to use the "
                                     f"plan's own nodes): {exc.got}", str(args.cluster)) from None
                if exc.source == "running plan":
                    raise InputError(f"{args.plan} (--plan)", exc.field, exc.expected,
                                     exc.got) from None
                raise
            doc = res.document(policy=placer, timings=not args.no_timings)
    written = write_plan_file(args.out, doc)  # a failed replan never replaces a placed plan
    if args.json:
        import json

        print(json.dumps(res.to_dict(), indent=2, sort_keys=True))
    else:
        _print_report(res, args, print_rows)
    if res.status == "time_limit":
        print(f"scepsy: time_limit: {res.placed.reason} ({wrote_note(args.out, written)})",
              file=sys.stderr)
        return EXIT_TIME_LIMIT
    if not res.ok:
        print(f"scepsy: {res.status}: {res.placed.reason} ({wrote_note(args.out, written)})",
              file=sys.stderr)
        return EXIT_UNPLACED
    return 0


def _where(x: dict[str, Any] | None) -> str:
    return "-" if x is None else f"{x['node']}:{','.join(map(str, x['gpus']))}"


def _print_report(res: Any, args: argparse.Namespace, print_rows: Any) -> None:
    rep = res.to_dict()
    rows = []
    for m, r in rep["llms"].items():
        b, a = r["before"], r["after"]
        rows.append({"llm": m, "before": _shape(b), "after": _shape(a), "kept": r["kept"],
                     "moved": r["moved"], "started": r["started"], "stopped": r["stopped"],
                     "lost": r["lost"]})
    print_rows(rows, ["llm", "before", "after", "kept", "moved", "started", "stopped", "lost"])
    changes = [{"action": name, "llm": r["llm"], "replica": _num(r),
                "from": _where(r["from"]), "to": _where(r["to"])}
               for name in ("moved", "started", "stopped", "lost") for r in rep[name]]
    if changes:
        print()
        print_rows(changes, ["action", "llm", "replica", "from", "to"])
    print()
    obj = rep["objective_s"]
    print(f"events: {', '.join(rep['events'])}; status {rep['status']}"
          + (f": {rep['reason']}" if rep["reason"] else ""))
    if obj is not None:
        print(f"objective {obj:.6g} s (latency + {res.change_penalty_s:g} s per replica started "
              f"or stopped) + {res.move_cost_s:g} s x {len(res.moved)} moved = "
              f"{rep['cost_s']:.6g} s; {rep['gpus_used']} GPUs used; moves "
              f"{'proven fewest' if rep['moves_minimal'] else 'not proven fewest'}; "
              f"{rep['seconds']:.3f} s; wrote {args.out}")


def _shape(i: dict[str, Any] | None) -> str:
    return "-" if i is None else f"{i['replicas']} x {i['gpu']} tp{i['tp']} {i['share']:g}"


def _num(r: dict[str, Any]) -> str:
    b, a = r["replica_before"], r["replica_after"]
    if b is None:
        return f"-> {a}"
    if a is None:
        return f"{b}"
    return f"{b}" if a == b else f"{b} -> {a}"
