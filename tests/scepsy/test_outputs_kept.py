"""A failed run never destroys a good result; a plan without a placement is refused by the
commands that need one; plan.json's sizes are bounded before anything is expanded.

* every command that writes an output file or folder, failing (a bad flag, a bad input file,
  an infeasible plan), leaves what was at its outputs byte for byte and mtime for mtime as it
  was (a parametrised sweep, and a property over garbage input files);
* a failed ``plan``/``replan`` goes beside a placed plan at ``--out`` (``NAME.failed.json``);
* ``launch`` and ``replan`` refuse a plan without placement with one message (file, ``status``,
  the reason, what to do); ``report`` draws it and says on stderr it cannot be launched;
* an astronomically large ``replicas`` or ``tp`` is an InputError, quickly, not a MemoryError.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO, run_cli
from scepsy_common.errors import InputError
from scepsy_serve.launch.planfile import (
    failed_plan_path,
    launch_plan,
    parse_plan,
    write_plan_file,
)

DATA = REPO / "datasets"
CPU = ["--catalog", str(DATA / "catalogs" / "cpu-host.yaml"),
       "--curves", str(DATA / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json")]
WORKFLOW = str(DATA / "workflows" / "cpu-rag-beam.yaml")
PLAN = ["plan", *CPU, "--cluster", str(DATA / "clusters" / "cpu-host.yaml"),
        "--workflow", WORKFLOW, "--tp", "1,2", "--shares", "0.5,1", "--trace-requests", "100",
        "--quiet", "--no-timings"]
INFEASIBLE_TARGET = "2000"  # the CPU host carries about 5 req/s


def cli(*argv: str) -> tuple[int, str, str]:
    """:func:`run_cli`, argparse's own exit (a bad flag) read as its status."""
    try:
        return run_cli(*argv)
    except SystemExit as exc:
        return int(exc.code or 0), "", ""


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A placed plan and an infeasible one of the CPU host, written by ``scepsy plan``."""
    d = tmp_path_factory.mktemp("plans")
    good, bad = d / "good.json", d / "infeasible.json"
    assert cli(*PLAN, "--target", "2", "--out", str(good))[0] == 0
    code, _, err = cli(*PLAN, "--target", INFEASIBLE_TARGET, "--out", str(bad))
    assert code == 1 and f"wrote {bad}" in err
    huge = json.loads(good.read_text())
    m = sorted(huge["llms"])[0]
    huge["llms"][m]["replicas"] = huge["allocation"]["llms"][m]["replicas"] = 10**18
    (d / "huge.json").write_text(json.dumps(huge))
    (d / "garbage.json").write_text('{"version": 1, "status": ')
    return {"good": good, "infeasible": bad, "huge": d / "huge.json",
            "garbage": d / "garbage.json"}


def snapshot(*paths: Path) -> dict[str, tuple[bytes, int]]:
    """Every file at or under ``paths``: its bytes and mtime (ns)."""
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in files:
            out[str(p)] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


def assert_untouched(before: dict[str, tuple[bytes, int]], *paths: Path,
                     allowed_new: tuple[Path, ...] = ()) -> None:
    after = snapshot(*paths)
    for name, (data, mtime) in before.items():
        assert name in after, f"{name} was removed"
        assert after[name][0] == data, f"{name} was rewritten"
        assert after[name][1] == mtime, f"{name} was touched"
    new = set(after) - set(before) - {str(p) for p in allowed_new}
    assert not new, f"new files {sorted(new)}"


# ------------------------------------------------------------------ the outputs of a command


def _launch_folder(tmp: Path, plans: dict[str, Path]) -> Path:
    out = tmp / "launch-shell"
    assert cli("launch", str(plans["good"]), "--target", "shell", "--out", str(out))[0] == 0
    return out


def _report_folder(tmp: Path, plans: dict[str, Path]) -> Path:
    out = tmp / "good-report"
    assert cli("report", str(plans["good"]), "--out", str(out))[0] == 0
    return out


def _plan_copy(tmp: Path, plans: dict[str, Path]) -> Path:
    out = tmp / "plan.json"
    shutil.copy2(plans["good"], out)
    return out


def _file(name: str, text: str = "an earlier good result\n") -> Callable[[Path, Any], Path]:
    def make(tmp: Path, plans: dict[str, Path]) -> Path:
        out = tmp / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        return out
    return make


@contextlib.contextmanager
def _listening() -> Any:
    """A free port something listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _muxserve_copy(tmp: Path, plans: dict[str, Path]) -> Path:
    """A copy of the bundled MuxServe results folder; its workload YAML is the "output"."""
    folder = tmp / "mux"
    shutil.copytree(DATA / "e2e" / "muxserve-example", folder)
    return folder / "yamls" / "example_load.yaml"


Case = tuple[str, Callable[[Path, Any], Path], Callable[[Path, Path, Any], list[str]], int]
"""(id, make the existing output, the failing command's argv, expected exit status)"""

CASES: list[Case] = [
    ("plan bad flag", _plan_copy,
     lambda out, tmp, p: [*PLAN, "--target", "2", "--tp", "0", "--out", str(out)], 2),
    ("plan missing workflow", _plan_copy,
     lambda out, tmp, p: [*PLAN, "--workflow", str(tmp / "nope.yaml"), "--target", "2",
                          "--out", str(out)], 2),
    ("plan bad cluster", _plan_copy,
     lambda out, tmp, p: [*PLAN, "--cluster", str(p["garbage"]), "--target", "2",
                          "--out", str(out)], 2),
    ("plan infeasible", _plan_copy,
     lambda out, tmp, p: [*PLAN, "--target", INFEASIBLE_TARGET, "--out", str(out)], 1),
    ("plan --launch unknown target", _plan_copy,
     lambda out, tmp, p: [*PLAN, "--target", "2", "--launch", "nosuch", "--out", str(out)], 2),
    ("replan bad event", _plan_copy,
     lambda out, tmp, p: ["replan", "--plan", str(p["good"]), "--workflow", WORKFLOW, *CPU,
                          "--event", "exploded=host", "--out", str(out)], 2),
    ("replan infeasible plan", _plan_copy,
     lambda out, tmp, p: ["replan", "--plan", str(p["infeasible"]), "--workflow", WORKFLOW,
                          *CPU, "--event", "load=cpu_rag*1.1", "--out", str(out)], 2),
    ("replan infeasible after the event", _plan_copy,
     lambda out, tmp, p: ["replan", "--plan", str(p["good"]), "--workflow", WORKFLOW, *CPU,
                          "--event", "load=cpu_rag*100", "--out", str(out)], 1),
    ("replan over its own --plan", _plan_copy,  # refused before anything runs
     lambda out, tmp, p: ["replan", "--plan", str(out), "--workflow", WORKFLOW, *CPU,
                          "--event", "load=cpu_rag*100", "--out", str(out)], 2),
    ("launch --apply bad --node", _launch_folder,
     lambda out, tmp, p: ["launch", str(p["good"]), "--target", "shell", "--out", str(out),
                          "--apply", "--node", "nosuch"], 2),
    ("launch bad target", _launch_folder,
     lambda out, tmp, p: ["launch", str(p["good"]), "--target", "nosuch", "--out", str(out)],
     2),
    ("launch infeasible plan", _launch_folder,
     lambda out, tmp, p: ["launch", str(p["infeasible"]), "--target", "shell", "--out",
                          str(out)], 2),
    ("launch huge plan", _launch_folder,
     lambda out, tmp, p: ["launch", str(p["huge"]), "--target", "k8s", "--out", str(out)], 2),
    ("launch garbage plan", _launch_folder,
     lambda out, tmp, p: ["launch", str(p["garbage"]), "--target", "routes", "--out",
                          str(out)], 2),
    ("report garbage plan", _report_folder,
     lambda out, tmp, p: ["report", str(p["garbage"]), "--out", str(out)], 2),
    ("report huge plan", _report_folder,
     lambda out, tmp, p: ["report", str(p["huge"]), "--out", str(out)], 2),
    ("profile fit bad measurements", _file("curves.json"),
     lambda out, tmp, p: ["profile", "fit", "--measurements", str(p["garbage"]),
                          "--out", str(out)], 2),
    ("profile fit --catalog-out without a store", _file("curves.json"),
     lambda out, tmp, p: ["profile", "fit", "--measurements",
                          str(DATA / "profiles" / "example-measurements.jsonl"), "--out",
                          str(out), "--catalog-out", str(tmp / "catalog.yaml"), "--quiet"], 2),
    ("profile fit --catalog-out is --out", _file("curves.json"),
     lambda out, tmp, p: ["profile", "fit", "--measurements",
                          str(DATA / "profiles" / "example-measurements.jsonl"), "--out",
                          str(out), "--catalog-out", str(out), "--quiet"], 2),
    ("trace generate bad flag", _file("trace.jsonl"),
     lambda out, tmp, p: ["trace", "generate", "--workflow", WORKFLOW, "--requests", "-3",
                          "--out", str(out)], 2),
    ("trace generate bad workflow", _file("trace.jsonl"),
     lambda out, tmp, p: ["trace", "generate", "--workflow", str(p["garbage"]), "--requests",
                          "3", "--out", str(out)], 2),
    ("trace import bad file", _file("trace.jsonl"),
     lambda out, tmp, p: ["trace", "import", str(p["garbage"]), "--out", str(out)], 2),
    ("record over an earlier recording", _file("recorded.jsonl"),
     lambda out, tmp, p: ["record", "--listen", "127.0.0.1:0", "--upstream",
                          "http://127.0.0.1:9", "--out", str(out)], 2),
    ("drive bad routes", _file("measured.jsonl"),
     lambda out, tmp, p: ["drive", "--workflow", WORKFLOW, "--routes", str(p["garbage"]),
                          "--rate", "1", "--requests", "2", "--trace-out", str(out)], 2),
    ("validate --json over a run file of DIR", _muxserve_copy,
     lambda out, tmp, p: ["validate", "muxserve", str(out.parents[1]), "--no-simulate",
                          "--json", str(out)], 2),
    ("validate --fit-overheads into DIR's merged/", _muxserve_copy,  # would become an input
     lambda out, tmp, p: ["validate", "muxserve", str(out.parents[1]), "--fit-overheads",
                          str(out.parents[1] / "merged" / "overheads.yaml")], 2),
    ("control --log is the --plan", _plan_copy,  # the log is appended to
     lambda out, tmp, p: ["control", "--plan", str(out), "--workflow", WORKFLOW, "--dry-run",
                          "--gateway", "http://127.0.0.1:9", "--duration", "1",
                          "--log", str(out)], 2),
    ("bench loop bad flag", _file("bench-loop/results.json"),
     lambda out, tmp, p: ["bench", "loop", "--requests", "0", "--out", str(out.parent)], 2),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_failed_command_leaves_existing_outputs_untouched(case, plans, tmp_path):
    _, make, argv, expected = case
    out = make(tmp_path, plans)
    before = snapshot(tmp_path)
    time.sleep(0.01)  # a rewrite would show in the mtime
    code, _, err = cli(*argv(out, tmp_path, plans))
    assert code == expected, err
    assert "Traceback" not in err
    # a failed plan or replan goes beside the placed plan it would have replaced
    assert_untouched(before, tmp_path, allowed_new=(failed_plan_path(out),))


def test_launch_apply_with_busy_ports_is_refused_before_the_folder_is_replaced(plans, tmp_path):
    out = _launch_folder(tmp_path, plans)
    doc = json.loads(plans["good"].read_text())
    with _listening() as port:
        doc["launch"]["base_port"] = port
        plan = tmp_path / "busy.json"
        plan.write_text(json.dumps(doc))
        before = snapshot(out)
        code, _, err = cli("launch", str(plan), "--target", "shell", "--out", str(out),
                           "--apply")
    assert code == 2 and f"(port {port})" in err and "launch.base_port" in err
    assert_untouched(before, out)


INPUT_FILES = {  # a command whose input file is FILE, and its output at OUT
    "launch": ["launch", "FILE", "--target", "shell", "--out", "OUT"],
    "report": ["report", "FILE", "--out", "OUT"],
    "replan": ["replan", "--plan", "FILE", "--workflow", WORKFLOW, *CPU, "--event",
               "load=cpu_rag*1.1", "--out", "OUT"],
    "plan": [*PLAN, "--target", "2", "--cluster", "FILE", "--out", "OUT"],
    "profile fit": ["profile", "fit", "--measurements", "FILE", "--out", "OUT"],
    "trace import": ["trace", "import", "FILE", "--out", "OUT"],
}


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=st.sampled_from(sorted(INPUT_FILES)),
       content=st.one_of(st.binary(max_size=64),
                         st.text(alphabet='{}[]":,0123456789versiontaul \n', max_size=64)
                         .map(str.encode)))
def test_garbage_input_files_leave_outputs_untouched(command, content, plans, tmp_path):
    case = tmp_path / f"case-{os.urandom(4).hex()}"
    case.mkdir()
    bad = case / "input.json"
    bad.write_bytes(content)
    if command in ("launch", "report"):
        out = (_launch_folder if command == "launch" else _report_folder)(case, plans)
    elif command in ("plan", "replan"):
        out = _plan_copy(case, plans)
    else:
        out = _file("out.json")(case, plans)
    before = snapshot(case)
    argv = [str(bad) if a == "FILE" else str(out) if a == "OUT" else a
            for a in INPUT_FILES[command]]
    code, _, err = cli(*argv)
    assert code == 2, err
    assert_untouched(before, case)


# ------------------------------------------------------------- a failed plan, kept beside


def test_a_failed_plan_goes_beside_a_placed_one_and_says_so(plans, tmp_path):
    out = _plan_copy(tmp_path, plans)
    good = out.read_bytes()
    code, _, err = cli(*PLAN, "--target", INFEASIBLE_TARGET, "--out", str(out))
    assert code == 1
    failed = tmp_path / "plan.failed.json"
    assert out.read_bytes() == good
    assert json.loads(failed.read_text())["status"] == "infeasible"
    assert f"{out} holds the last placed plan and was kept; this run's plan is in {failed}" \
        in err
    # the failed plan is drawn by report; a placed run writes --out as usual
    assert cli("report", str(failed))[0] == 0
    assert cli(*PLAN, "--target", "1", "--out", str(out))[0] == 0
    assert json.loads(out.read_text())["status"] != "infeasible"


def test_write_plan_file_keeps_a_placed_plan(plans, tmp_path):
    good = json.loads(plans["good"].read_text())
    bad = json.loads(plans["infeasible"].read_text())
    out = tmp_path / "p"
    assert write_plan_file(out, bad) == out  # nothing there: written where asked
    assert write_plan_file(out, good) == out  # a failed plan is replaced by a placed one
    text = out.read_text()
    assert write_plan_file(out, bad) == tmp_path / "p.failed.json"
    assert out.read_text() == text
    assert failed_plan_path("a/plan.json") == Path("a/plan.failed.json")


# ---------------------------------------------------------- a plan without placement, refused


@pytest.mark.parametrize("command", ["launch", "replan"])
def test_launch_and_replan_refuse_a_plan_without_placement(command, plans, tmp_path):
    src = plans["infeasible"]
    argv = (["launch", str(src), "--target", "shell", "--out", str(tmp_path / "l")]
            if command == "launch" else
            ["replan", "--plan", str(src), "--workflow", WORKFLOW, *CPU, "--event",
             "load=cpu_rag*1.1", "--out", str(tmp_path / "r.json")])
    code, _, err = cli(*argv)
    assert code == 2
    line = err.strip()
    assert "\n" not in line
    assert line.startswith(f"scepsy: error: {src}: status: expected a placed plan; this plan "
                           "is infeasible (the targets need more GPUs")
    assert "re-run `scepsy plan`" in line
    assert not list(tmp_path.iterdir())


def test_report_draws_a_plan_without_placement_and_says_it_cannot_be_launched(plans, tmp_path):
    code, _, err = cli("report", str(plans["infeasible"]), "--out", str(tmp_path / "r"))
    assert code == 0  # the report is what was asked for; stderr says it is not a plan to launch
    assert "status infeasible: no placed plan, nothing of it can be launched" in err
    assert "What happened" in (tmp_path / "r" / "index.html").read_text()


# --------------------------------------------------------------- sizes bounded by the cluster


def _set(doc: dict[str, Any], field: str, value: int) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    m = sorted(doc["llms"])[0]
    if field in ("replicas", "tp"):
        doc["llms"][m][field] = doc["allocation"]["llms"][m][field] = value
    elif field == "replica":
        doc["placement"]["instances"][0]["replica"] = value
    elif field == "gpu index":
        doc["placement"]["instances"][0]["gpus"] = [value]
    elif field == "base_port":
        doc["launch"]["base_port"] = value
    elif field in ("nodes", "gpus_per_node"):
        doc["cluster"]["pools"][0][field] = value
    return doc


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["replicas", "tp", "replica", "gpu index", "base_port", "nodes",
                              "gpus_per_node"]),
       value=st.one_of(st.integers(min_value=10**5, max_value=10**40),
                       st.sampled_from([2**31, 2**63, 10**18])))
def test_huge_sizes_are_input_errors_quickly(field, value, plans):
    doc = _set(json.loads(plans["good"].read_text()), field, value)
    t0 = time.monotonic()
    with pytest.raises(InputError) as e:
        launch_plan(parse_plan(doc, "plan.json"), "plan.json")
    assert time.monotonic() - t0 < 2.0
    assert str(e.value).startswith("plan.json: ")


def test_replicas_beyond_the_cluster_name_the_field(plans):
    doc = _set(json.loads(plans["good"].read_text()), "replicas", 10**18)
    with pytest.raises(InputError, match=r"llms\.\w+\.replicas: expected at most 4 \(replicas "
                       r"x tp 1 x share 0\.5 within the cluster's 2 cpu GPUs\)"):
        parse_plan(doc, "plan.json")
    doc = _set(json.loads(plans["good"].read_text()), "tp", 3)
    with pytest.raises(InputError, match=r"llms\.\w+\.tp: expected at most 2 \(the most cpu "
                       "GPUs one node"):
        parse_plan(doc, "plan.json")


def test_control_refuses_a_log_that_is_its_plan_before_it_starts(plans, tmp_path):
    # the decision log is appended to: over the plan it would leave plan.json unparsable
    plan = _plan_copy(tmp_path, plans)
    before = snapshot(tmp_path)
    code, _, err = cli("control", "--plan", str(plan), "--workflow", WORKFLOW, "--dry-run",
                       "--gateway", "http://127.0.0.1:9", "--duration", "1", "--log", str(plan))
    assert code == 2 and err.startswith("scepsy: error: --log: expected a path other than an "
                                        "input"), err
    assert_untouched(before, tmp_path)
