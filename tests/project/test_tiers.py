"""The test tiers (docs/testing.md): the fast tier leaves out long runs and real engines, every
tier (``CI`` or ``SCEPSY_ALL_TESTS``) keeps them, and the session's first line says which tier
runs and about how long it takes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import conftest


def _clear(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for name in conftest.ALL_TESTS_ENV:
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("env, tier", [({}, "fast"), ({"SCEPSY_ALL_TESTS": "1"}, "all"),
                                       ({"CI": "true"}, "all"), ({"CI": "0"}, "fast"),
                                       ({"SCEPSY_ALL_TESTS": "false"}, "fast")])
def test_the_session_header_names_the_tier_and_its_duration(monkeypatch, env, tier):
    _clear(monkeypatch, env)
    line = conftest.pytest_report_header(None)  # type: ignore[arg-type]
    assert f"about {conftest.TIER_MINUTES[tier]} minutes" in line
    assert ("fast tier" in line) == (tier == "fast")


class _Item:
    def __init__(self, *markers: str, nodeid: str = "tests/x/test_a.py::t") -> None:
        self.markers = set(markers)
        self.nodeid = nodeid

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


@pytest.mark.parametrize("env, kept", [({}, {"plain", "shared_data"}),
                                       ({"CI": "1"}, {"plain", "shared_data", "slow", "vllm",
                                                      "torch", "slow+vllm"})])
def test_the_fast_tier_deselects_long_runs_and_real_engines(monkeypatch, env, kept):
    _clear(monkeypatch, env)
    items = {"plain": _Item(), "shared_data": _Item("shared_data"), "slow": _Item("slow"),
             "vllm": _Item("vllm"), "torch": _Item("torch"), "slow+vllm": _Item("slow", "vllm")}
    names = {id(v): k for k, v in items.items()}
    deselected: list[object] = []
    config = SimpleNamespace(hook=SimpleNamespace(
        pytest_deselected=lambda items: deselected.extend(items)))
    got = list(items.values())
    conftest.pytest_collection_modifyitems(config, got)  # type: ignore[arg-type]
    assert {names[id(i)] for i in got} == kept
    assert {names[id(i)] for i in deselected} == set(items) - kept


def test_every_tier_starts_with_the_costliest_files_and_keeps_each_files_order():
    a = [_Item(nodeid=f"tests/a/test_many.py::t{k}") for k in range(40)]  # 40 x 0.25 s
    b = [_Item(nodeid="tests/b/test_plain.py::first"),
         _Item("vllm", nodeid="tests/b/test_plain.py::engine")]  # 60.25 s
    c = [_Item("slow", nodeid="tests/c/test_long.py::only")]  # 30 s
    got = conftest._longest_first([*a, *b, *c])
    assert [i.nodeid.split("::")[0] for i in got] == (
        ["tests/b/test_plain.py"] * 2 + ["tests/c/test_long.py"] + ["tests/a/test_many.py"] * 40)
    assert got[:2] == b and got[3:] == a
