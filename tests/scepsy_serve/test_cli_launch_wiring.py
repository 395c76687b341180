"""The command line's launch wiring: ``scepsy plan --catalog`` (a device and a model the bundled
catalog lacks), ``scepsy plan --launch TARGET`` (plan.json, then the target's files rendered
from it), ``--catalog`` for predict and simulate, the ``launch``, ``stop``, ``drive`` and
``bench loop`` commands registered (and imported only when named), and bad inputs: exit 2, one
line, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scepsy.cli import main
from scepsy_serve.launch.planfile import load_plan
from scepsy_serve.launch.renderers import MANIFEST, get_renderer, read_rendered

REPO = Path(__file__).resolve().parents[2]
CATALOG = str(REPO / "datasets" / "catalogs" / "cpu-host.yaml")
CURVES = str(REPO / "datasets" / "profiles" / "vllm-cpu-llama-3-8b-x0.0625-curves.json")
CLUSTER = str(REPO / "datasets" / "clusters" / "cpu-host.yaml")
WORKLOAD = str(REPO / "datasets" / "workflows" / "cpu-rag-beam.yaml")
RAG = str(REPO / "datasets" / "workflows" / "cpu-rag.yaml")
CPU_PLAN = ["plan", "--catalog", CATALOG, "--curves", CURVES, "--cluster", CLUSTER,
            "--workflow", WORKLOAD, "--target", "3", "--tp", "1,2", "--trace-requests", "200",
            "--quiet"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _one_line_error(code: int, err: str, *words: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("scepsy"), err
    for w in words:
        assert w in lines[0], (w, err)


# ------------------------------------------------------------------------------ --catalog


def test_plan_with_catalog_places_the_cpu_target(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, text, err = run(capsys, *CPU_PLAN, "--out", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["devices"] == {"cpu": {"kind": "cpu", "memory_gib": 4.0}}
    assert doc["placement"]["placed"] is True
    cores = {}
    for inst in doc["placement"]["instances"]:
        assert inst["node"] == "host" and inst["share"] <= 1.0
        assert len(inst["gpus"]) in (1, 2)
        for g in inst["gpus"]:
            cores[g] = cores.get(g, 0.0) + inst["share"]
    assert set(cores) <= {0, 1}
    assert all(v <= 1.0 + 1e-9 for v in cores.values())  # no core over-shared
    for name, row in doc["llms"].items():
        assert row["model"] == "llama-3-8b:x0.0625" and name in text
    for w, row in doc["workflows"].items():
        assert row["throughput"] == pytest.approx(1.5) and row["mean_latency_s"] > 0, w


def test_plan_without_catalog_names_the_unknown_device(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    argv = [a for a in CPU_PLAN if a != CATALOG and a != "--catalog"]
    code, _, err = run(capsys, *argv, "--out", str(out))
    _one_line_error(code, err, "cpu")
    assert not out.exists()


def test_catalog_scope_ends_with_the_call(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    from scepsy_profile.catalog import default_catalog

    code, _, err = run(capsys, *CPU_PLAN, "--out", str(tmp_path / "plan.json"))
    assert code == 0, err
    assert not default_catalog().has_gpu("cpu")
    assert not default_catalog().has_model("llama-3-8b:x0.0625")


@pytest.mark.parametrize("command", ["predict", "simulate"])
def test_predict_and_simulate_take_a_catalog(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                             command: str) -> None:
    out = tmp_path / "plan.json"
    assert run(capsys, *CPU_PLAN, "--out", str(out))[0] == 0
    extra = ["--requests", "200"] if command == "simulate" else []
    code, text, err = run(capsys, command, "--catalog", CATALOG, "--curves", CURVES,
                          "--workflow", WORKLOAD, "--allocation", str(out), "--rate", "2",
                          "--trace-requests", "200", "--json", *extra)
    assert code == 0, err
    doc = json.loads(text)
    assert set(doc["workflows"]) == {"cpu_rag", "cpu_beam_search"}
    code, _, err = run(capsys, command, "--curves", CURVES, "--workflow", WORKLOAD,
                       "--allocation", str(out), "--rate", "2", *extra)
    _one_line_error(code, err)


def test_bad_catalog_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  cpu: {memory_gib: -1, bf16_tflops: 1, hbm_gbps: 1, "
                   "nvlink_domain: 2, interconnect_gbps: 1}\n")
    out = tmp_path / "plan.json"
    argv = [str(bad) if a == CATALOG else a for a in CPU_PLAN]
    code, _, err = run(capsys, *argv, "--out", str(out))
    _one_line_error(code, err, "memory_gib")
    code, _, err = run(capsys, *[str(tmp_path / "none.yaml") if a == CATALOG else a
                                 for a in CPU_PLAN], "--out", str(out))
    _one_line_error(code, err, "none.yaml")
    assert not out.exists()


# ------------------------------------------------------------------------------- --launch


def test_plan_launch_shell_writes_both(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, text, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "shell")
    assert code == 0, err
    folder = tmp_path / "launch-shell"
    assert (folder / MANIFEST).read_text().strip() == "shell"
    assert (folder / "host" / "start.sh").is_file() and (folder / "routes.json").is_file()
    assert str(folder) in text
    # the files are the render of the plan.json written, nothing else
    plan = load_plan(out)
    files = read_rendered(folder)
    assert files == dict(get_renderer("shell").render(plan))
    assert get_renderer("shell").parse(files) == plan.assignments()


@pytest.mark.parametrize("target", ["k8s", "ray", "routes"])
def test_plan_launch_other_targets_into_launch_out(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, target: str) -> None:
    out = tmp_path / "plan.json"
    dest = tmp_path / "rendered"
    code, _, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", target,
                       "--launch-out", str(dest), "--json")
    assert code == 0, err
    assert (dest / MANIFEST).read_text().strip() == target
    assert read_rendered(dest) == dict(get_renderer(target).render(load_plan(out)))


def test_plan_launch_several_targets(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, text, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "shell,k8s,ray")
    assert code == 0, err
    assert text.count("rendered ") == 3
    plan = load_plan(out)
    for target in ("shell", "k8s", "ray"):
        folder = tmp_path / f"launch-{target}"
        assert read_rendered(folder) == dict(get_renderer(target).render(plan)), target
    dest = tmp_path / "all"
    code, _, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "routes,shell",
                       "--launch-out", str(dest))
    assert code == 0, err
    assert sorted(p.name for p in dest.iterdir()) == ["routes", "shell"]
    code, _, err = run(capsys, *CPU_PLAN, "--out", str(tmp_path / "p2.json"),
                       "--launch", "shell,shell")
    _one_line_error(code, err, "--launch")
    assert not (tmp_path / "p2.json").exists()


def test_drive_needs_the_catalog_of_its_workflows(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    # the CPU workflows name a device and a model only the CPU catalog has: refused without it
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"version": 1, "workflows": {"cpu_rag": {
        m: [{"url": "http://127.0.0.1:9/v1", "model": m, "weight": 1.0}]
        for m in ("generator", "reranker", "rewriter")}}}))
    argv = ["drive", "--workflow", RAG, "--routes", str(routes), "--rate", "5", "--requests",
            "2", "--connect-timeout", "1", "--timeout", "2"]
    code, _, err = run(capsys, *argv)
    _one_line_error(code, err, "reference_gpu", "cpu")
    code, text, err = run(capsys, *argv, "--catalog", CATALOG)
    assert code == 1, err  # every call refused (nothing listens on port 9): failed, not a crash
    assert "sent 2 of 2 requests: 0 completed, 2 failed" in text


def test_plan_launch_bad_inputs_exit_2_before_planning(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    code, _, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "nope")
    _one_line_error(code, err, "--launch", "shell")
    assert not out.exists()

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    code, _, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "shell",
                       "--launch-out", str(theirs))
    _one_line_error(code, err, "--launch-out")
    assert not out.exists() and (theirs / "keep.txt").read_text() == "mine"

    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "shell",
                       "--launch-out", str(afile))
    _one_line_error(code, err, "--launch-out")
    assert not out.exists()

    code, _, err = run(capsys, *CPU_PLAN, "--out", str(out), "--launch-out", str(tmp_path / "x"))
    _one_line_error(code, err, "--launch-out", "--launch")
    assert not out.exists()


def test_plan_launch_replaces_its_own_folder(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    assert run(capsys, *CPU_PLAN, "--out", str(out), "--launch", "routes")[0] == 0
    first = read_rendered(tmp_path / "launch-routes")
    argv = [("5" if a == "3" else a) for a in CPU_PLAN]
    assert run(capsys, *argv, "--out", str(out), "--launch", "routes")[0] == 0
    assert read_rendered(tmp_path / "launch-routes") == dict(
        get_renderer("routes").render(load_plan(out)))
    assert set(first) == set(read_rendered(tmp_path / "launch-routes"))


# ------------------------------------------------------------------------- registration


@pytest.mark.parametrize("argv", [["launch", "--help"], ["stop", "--help"], ["drive", "--help"],
                                  ["bench", "loop", "--help"]])
def test_commands_are_registered(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, text, _ = run(capsys, *argv)
    assert code == 0 and "usage: scepsy" in text


def test_help_imports_no_launch_module() -> None:
    code = ("import sys\nfrom scepsy.cli import main\nmain(['--help'])\n"
            "print(sorted(m for m in sys.modules if m.startswith(('scepsy.cli.launch', "
            "'scepsy.cli.drive', 'scepsy_place'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, check=True)
    assert "launch" in done.stdout and "drive" in done.stdout  # listed in --help
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_bench_loop_bad_options_exit_2(capsys: pytest.CaptureFixture[str],
                                       tmp_path: Path) -> None:
    code, _, err = run(capsys, "bench", "loop", "--load", "2", "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "--load")
    code, _, err = run(capsys, "bench", "loop", "--shares", "0,1", "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "--shares")
    assert not (tmp_path / "o").exists()
