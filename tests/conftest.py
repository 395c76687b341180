"""Shared fixtures: a small synthetic profile fitted once per session, paths to repo data; and
the test tiers (docs/testing.md):

* ``slow``, ``vllm``, ``torch``: long tests (full-size benchmarks, whole loops) and real
  engines are deselected unless ``CI`` or ``SCEPSY_ALL_TESTS`` is set (CI sets ``CI``), so
  ``python -m pytest`` stays the fast tier;
* ``vllm``: then skipped unless a vLLM environment is found *and imports* (the vLLM backend's
  probe imports it);
* ``torch``: then skipped unless torch and transformers import.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import os
from pathlib import Path

import pytest

from scepsy_profile.fitted import FittedLatencyModel, fit_latency_model, load_curves
from scepsy_profile.measurements import Measurement
from scepsy_profile.roofline import RooflineModel, roofline_model
from scepsy_profile.synthetic import synthetic_measurements

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
BUNDLED_CURVES = REPO / "datasets" / "profiles" / "muxserve-a100-curves.json"
MODEL, GPU = "llama-2-7b", "A100-80GB"

ALL_TESTS_ENV = ("CI", "SCEPSY_ALL_TESTS")
"""Variables any of which (set, not empty, not ``0``/``false``) selects the ``slow`` tests."""


def all_tests() -> bool:
    """Whether the ``slow`` tier runs (:data:`ALL_TESTS_ENV`)."""
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no")
               for v in ALL_TESTS_ENV)


LONG_MARKERS = ("slow", "vllm", "torch")
"""The markers of the tests only every tier runs: long runs and real engines (a vLLM server or
a torch model takes 15-70 s to start on 2 cores)."""


def _long(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in LONG_MARKERS)


COST_S = {"vllm": 60.0, "slow": 30.0, "torch": 5.0}
"""About what one test of each marker costs (s) on 2 cores, for :func:`_longest_first`; any
other test about :data:`PLAIN_COST_S`."""
PLAIN_COST_S = 0.25


def _cost(item: pytest.Item) -> float:
    return max([COST_S[m] for m in COST_S if item.get_closest_marker(m) is not None],
               default=PLAIN_COST_S)


def _longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items, their files ordered by estimated cost, the costliest first (a file's own order
    kept): with ``--dist loadfile --no-loadscope-reorder`` the two processes start with the
    files that start real engines, so the run does not end on one of them (longest processing
    time first)."""
    cost: dict[str, float] = {}
    for it in items:
        cost[it.nodeid.split("::", 1)[0]] = cost.get(it.nodeid.split("::", 1)[0], 0.0) + _cost(it)
    rank = {f: k for k, f in enumerate(sorted(cost, key=lambda f: -cost[f]))}
    return sorted(items, key=lambda it: rank[it.nodeid.split("::", 1)[0]])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not all_tests():
        long = [it for it in items if _long(it)]
        if long:
            config.hook.pytest_deselected(items=long)
            items[:] = [it for it in items if not _long(it)]
    items[:] = _longest_first(items)


TIER_MINUTES = {"fast": "6-7", "all": "18"}
"""About how long each tier runs on the 2-core development machine with two processes
(docs/testing.md, "How long")."""


def pytest_report_header(config: pytest.Config) -> str:
    """The first line a run prints: which tier runs and about how long it takes."""
    if all_tests():
        return (f"tiers: every test (CI or SCEPSY_ALL_TESTS set): about "
                f"{TIER_MINUTES['all']} minutes on 2 cores")
    return (f"tiers: the fast tier, about {TIER_MINUTES['fast']} minutes on 2 cores; long "
            "tests and real engines (markers slow, vllm, torch) run in CI, or here with "
            "SCEPSY_ALL_TESTS=1")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not all_tests():
        terminalreporter.write_line("long tests and real engines (markers slow, vllm, torch) "
                                    "were left out: they run in CI, or here with "
                                    "SCEPSY_ALL_TESTS=1")


@functools.cache
def _vllm_missing() -> str | None:
    """Why the vLLM tests cannot run here (None: a vLLM environment that imports)."""
    from scepsy_profile.profiling.vllm_backend import VllmBackend

    reason = VllmBackend().unavailable()
    return None if reason is None else f"vLLM unavailable: {reason}"


@functools.cache
def _torch_missing() -> str | None:
    """Why the torch tests cannot run here: torch or transformers absent (an installed one that
    fails to import is an error, not a skip)."""
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is not installed"
        importlib.import_module(mod)
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("vllm") is not None and (why := _vllm_missing()):
        pytest.skip(why)
    if item.get_closest_marker("torch") is not None and (why := _torch_missing()):
        pytest.skip(why)


@pytest.fixture(scope="session")
def roofline() -> RooflineModel:
    return roofline_model()


@pytest.fixture(scope="session")
def synthetic_points(roofline: RooflineModel) -> tuple[Measurement, ...]:
    """A noisy grid generated by the roofline model: the truth the fits are checked against."""
    return synthetic_measurements(roofline, MODEL, GPU, tps=(1, 4), noise=0.02, seed=7)


@pytest.fixture(scope="session")
def synthetic_fit(synthetic_points: tuple[Measurement, ...]) -> FittedLatencyModel:
    return fit_latency_model(synthetic_points, seed=0)


@pytest.fixture(scope="session")
def bundled_curves() -> FittedLatencyModel:
    return load_curves(BUNDLED_CURVES)


def shared_file(relative: str) -> Path:
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"{path} not present (the shared data folder is optional)")
    return path


@pytest.fixture
def tiny_openb(tmp_path: Path) -> tuple[Path, Path]:
    """A two-node nodes CSV and a six-pod pods CSV in ``tmp_path``: a trace that replays fast."""
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                     "n0,32000,262144,2,V100\nn1,32000,262144,2,V100\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
                    "creation_time,deletion_time,scheduled_time\n"
                    + "".join(f"p{i},1000,1024,1,500,,LS,Running,{i},{i + 100},{i}\n"
                              for i in range(6)))
    return nodes, pods


def run_cli(*argv: str) -> tuple[int, str, str]:
    """``scepsy ARGV`` in this process: (exit status, stdout, stderr)."""
    from scepsy.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()
