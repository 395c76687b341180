"""The type checker passes on src/: ``python -m mypy`` with the ``[tool.mypy]`` configuration of
pyproject.toml (slow: runs in CI, or here with SCEPSY_ALL_TESTS=1)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow
def test_mypy_passes_on_src() -> None:
    pytest.importorskip("mypy.api")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, f"mypy failed:\n{res.stdout}{res.stderr}"
