"""One conformance suite every registered launch renderer passes (python-mip's rule: one test
suite over every backend): deterministic bytes, safe relative paths, a round trip
plan → render → parse giving back the plan's assignments in the fields the target expresses
exactly, a valid routing table, and atomic writes of a render into a folder.

Plans: the hand-built GPU and CPU plans (tests/fakes/launch_plans.py) and random valid plans
(hypothesis) whose names use every character a name may hold (``_ . + : /`` included).
"""

from __future__ import annotations

import json
import math
import os
import string
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes.launch_plans import cpu_plan, gpu_plan
from scepsy_common.errors import InputError, is_name
from scepsy_serve.launch.launchplan import (
    Assignment,
    DeviceLaunch,
    EngineLaunch,
    LaunchPlan,
    ModelLaunch,
    ReplicaLaunch,
    assign_ports,
    url_host,
)
from scepsy_serve.launch.planfile import load_plan
from scepsy_serve.launch.renderers import (
    MANIFEST,
    get_renderer,
    read_rendered,
    renderer_names,
    write_rendered,
)
from scepsy_serve.launch.routes import WEIGHT_TOL, parse_routes

NAMES = renderer_names()
FIELDS = ("tp", "share", "node", "gpus")
GOLDEN = Path(__file__).resolve().parents[1].joinpath("golden") / "launch"
EXAMPLE_PLAN = Path(__file__).resolve().parents[2] / "datasets" / "plans" / "rag-beam-a100-16.json"
GOLDEN_TARGETS = ("k8s", "ray", "routes")  # the shell target keeps its own (tests/scepsy_serve/test_launch_shell.py)

FIRST = string.ascii_letters + string.digits + "_"
REST = FIRST + ".+:/-"
names = st.builds(lambda a, b: a + b, st.sampled_from(FIRST),
                  st.text(REST, min_size=0, max_size=24)).filter(is_name)


@st.composite
def launch_plans(draw: st.DrawFn) -> LaunchPlan:
    """A random valid GPU plan: 1-3 nodes of 8 GPUs, 1-3 LLMs with tp 1/2/4, shares, 1-3
    replicas each on random distinct GPUs of a random node; every LLM in some workflow."""
    node_names = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    llms = draw(st.lists(names, min_size=1, max_size=3, unique=True))
    gpu = "A100-80GB"
    models, reps = {}, []
    for m in llms:
        tp = draw(st.sampled_from((1, 2, 4)))
        share = draw(st.sampled_from((1.0, 0.5, 0.3, 0.25, 0.75)))
        n = draw(st.integers(1, 3))
        memory = 80.0 * share
        models[m] = ModelLaunch(m, draw(names), draw(names), gpu, tp, share, n, memory,
                                draw(st.floats(0.5, 60.0)))
        for i in range(n):
            node = draw(st.sampled_from(node_names))
            gpus = tuple(draw(st.permutations(range(8)))[:tp])
            reps.append(ReplicaLaunch(m, i, node, gpus, share, memory, 0))
    workflows = {draw(names): tuple(sorted(llms))}
    return LaunchPlan(
        name=draw(names), version=1, devices={gpu: DeviceLaunch(gpu, "cuda", 80.0)},
        nodes={n: gpu for n in node_names}, models=models,
        # a node whose name is no host name gets an address (else the plan is refused)
        addresses={n: f"10.0.0.{i + 1}" for i, n in enumerate(node_names) if url_host(n) is None},
        replicas=assign_ports(tuple(reps), 8000), workflows=workflows, engine=EngineLaunch())


def reordered(plan: LaunchPlan) -> LaunchPlan:
    """The same plan, every mapping and the replicas built in reverse insertion order."""
    def rev(m):
        return dict(reversed(list(m.items())))
    return LaunchPlan(
        name=plan.name, version=plan.version, devices=rev(plan.devices), nodes=rev(plan.nodes),
        addresses=rev(plan.addresses),
        models={k: replace(v, env=rev(v.env)) for k, v in rev(plan.models).items()},
        replicas=tuple(reversed(plan.replicas)), workflows=rev(plan.workflows),
        engine=replace(plan.engine, env=rev(plan.engine.env)))


def project(assignments: frozenset[Assignment], exact: frozenset[str]) -> set[tuple]:
    return {(a.llm, a.replica, *(getattr(a, f) if f in exact else None for f in FIELDS))
            for a in assignments}


def check_render(name: str, plan: LaunchPlan) -> None:
    r = get_renderer(name)
    files = r.render(plan)
    # deterministic bytes, whatever order the plan's mappings were built in
    assert r.render(plan) == files
    assert r.render(reordered(plan)) == files
    # safe relative POSIX paths, text
    for rel, text in files.items():
        p = Path(rel)
        assert not p.is_absolute() and ".." not in p.parts and rel == p.as_posix()
        assert rel != MANIFEST and isinstance(text, str)
    # round trip in the fields the target expresses exactly
    assert r.exact <= set(FIELDS)
    assert project(r.parse(files), r.exact) == project(plan.assignments(), r.exact)
    # a routing table for every workflow's LLMs, weights summing to 1
    routes = parse_routes(json.loads(files["routes.json"]), f"{name}/routes.json")
    assert set(routes.workflows) == set(plan.workflows)
    for w, llms in plan.workflows.items():
        assert set(routes.workflows[w]) == set(llms)
        for m, eps in routes.workflows[w].items():
            assert math.isclose(sum(e.weight for e in eps), 1.0, abs_tol=WEIGHT_TOL)
            assert {e.model for e in eps} == {m}


def test_the_builtin_targets_are_registered() -> None:
    assert {"k8s", "ray", "routes"} <= set(NAMES)
    with pytest.raises(InputError, match="target"):
        get_renderer("nomad")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("plan", [gpu_plan, cpu_plan], ids=["gpu", "cpu"])
def test_render_conforms_on_the_example_plans(name: str, plan) -> None:
    check_render(name, plan())


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=launch_plans())
def test_render_conforms_on_random_plans(name: str, plan: LaunchPlan) -> None:
    check_render(name, plan)


@pytest.mark.parametrize("name", NAMES)
def test_parse_sees_a_changed_assignment(name: str) -> None:
    """The round trip can fail: a plan with one replica moved renders differently and parses
    to a different assignment set in the exact fields (or, with no exact field, the same)."""
    r = get_renderer(name)
    plan = gpu_plan()
    moved = replace(plan, replicas=tuple(
        replace(x, share=0.25, gpus=(3,), node="node-b") if x.name == "small-0"
        else replace(x, share=0.25) if x.llm == "small" else x for x in plan.replicas))
    got = project(r.parse(r.render(moved)), r.exact)
    assert (got != project(plan.assignments(), r.exact)) == bool(r.exact & {"share", "gpus",
                                                                              "node"})


def example_plan() -> LaunchPlan:
    """The bundled example plan (the README's job, datasets/plans/README.md)."""
    return load_plan(EXAMPLE_PLAN)


@pytest.mark.parametrize(("name", "label", "plan"),
                         [(n, "gpu", gpu_plan) for n in GOLDEN_TARGETS]
                         + [(n, "cpu", cpu_plan) for n in GOLDEN_TARGETS]
                         + [(n, "example", example_plan) for n in NAMES])
def test_render_matches_the_reviewed_golden_files(name: str, label: str, plan) -> None:
    """Renders of the example plans, reviewed once and stored under tests/golden/launch/;
    ``SCEPSY_UPDATE_GOLDEN=1`` rewrites them (review the diff)."""
    folder = GOLDEN / name / label
    files = dict(get_renderer(name).render(plan()))
    if os.environ.get("SCEPSY_UPDATE_GOLDEN") == "1":
        write_rendered(files, folder, name)
    assert read_rendered(folder) == files


def test_the_example_plan_is_what_planning_gives_today(tmp_path: Path) -> None:
    """The bundled example plan (and so its golden renders) is what the README's command
    plans now: the same assignment of every replica (the floats of the prediction may differ
    in their last digits between machines; the assignment may not)."""
    import scepsy

    data = EXAMPLE_PLAN.parents[1]
    res = scepsy.plan(data / "workflows" / "rag-beam.yaml", data / "clusters" / "a100-16.yaml",
                      0.6, trace_requests=300)
    res.write(tmp_path / "plan.json", timings=False)
    again = load_plan(tmp_path / "plan.json")
    assert again.assignments() == example_plan().assignments()
    assert again.replicas == example_plan().replicas  # ports and memory too


# ------------------------------------------------------------------------------ write_rendered

@pytest.mark.parametrize("name", NAMES)
def test_write_rendered_writes_replaces_and_reads_back(name: str, tmp_path: Path) -> None:
    r = get_renderer(name)
    out = tmp_path / "out"
    files = r.render(gpu_plan())
    write_rendered(files, out, name)
    assert (out / MANIFEST).read_text() == name + "\n"
    assert read_rendered(out) == dict(files)
    for rel in files:
        mode = os.stat(out / rel).st_mode & 0o777
        assert mode == (0o755 if rel.endswith(".sh") else 0o644)
    # its own folder is replaced whole: files of the old render that the new one lacks go
    (out / "stale.txt").write_text("old")
    files2 = r.render(cpu_plan())
    write_rendered(files2, out, name)
    assert read_rendered(out) == dict(files2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left


def test_write_rendered_refuses_a_folder_of_the_users(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="--out"):
        write_rendered({"routes.json": "{}"}, out, "routes")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"
    empty = tmp_path / "empty"
    empty.mkdir()
    write_rendered({"routes.json": "{}\n"}, empty, "routes")  # an empty folder is fine
    assert read_rendered(empty) == {"routes.json": "{}\n"}


@pytest.mark.parametrize("bad", ["../escape.txt", "/abs.txt", "a/../../b", "./x", ""])
def test_write_rendered_leaves_nothing_on_failure(bad: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    write_rendered({"routes.json": "old\n"}, out, "routes")
    with pytest.raises(ValueError, match="unsafe path"):
        write_rendered({"a.txt": "new", bad: "x"}, out, "routes")
    assert read_rendered(out) == {"routes.json": "old\n"}  # the old render, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert not (tmp_path / "escape.txt").exists()
