"""A newcomer's first run: the test session says which tier runs and about how long it takes,
and the README says the same next to the command."""

from __future__ import annotations

import re

import pytest

import conftest
from conftest import REPO


@pytest.mark.parametrize("env, tier", [({}, "fast"), ({"SCEPSY_ALL_TESTS": "1"}, "all")])
def test_the_session_header_names_the_tier_and_its_duration(monkeypatch, env, tier):
    for name in conftest.ALL_TESTS_ENV:
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    line = conftest.pytest_report_header(None)  # type: ignore[arg-type]
    assert f"about {conftest.TIER_MINUTES[tier]} minutes" in line
    assert ("fast tier" in line) == (tier == "fast")


def test_readme_states_the_durations_the_header_prints():
    readme = (REPO / "README.md").read_text()
    for minutes in conftest.TIER_MINUTES.values():
        assert re.search(rf"about {re.escape(minutes.split('-')[0])}", readme), minutes
    assert "python -m pytest        # the fast tier: about 6-7 minutes" in readme
