"""The layer contract (docs/design.md): the packages build on each other one way, checked by
import-linter over ``.importlinter`` (``lint-imports``), and every folder of sources is a package
setuptools installs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
LAYERS = ("scepsy_common", "scepsy_profile", "scepsy_opt", "scepsy_place", "scepsy_serve",
          "scepsy")


def lint_imports(src: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts over the packages under ``src``."""
    code = ("import os, sys; sys.path.insert(0, os.environ['SCEPSY_LINT_SRC']); "
            "from importlinter.cli import lint_imports_command; lint_imports_command()")
    return subprocess.run([sys.executable, "-c", code, str(REPO / ".importlinter"), "--no-cache"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "SCEPSY_LINT_SRC": str(src)})


def test_the_contracts_are_kept() -> None:
    run = lint_imports(SRC)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


@pytest.mark.parametrize("module, line, broken", [
    # a lower package importing a higher one, even inside a function
    ("scepsy_opt/stats.py", "def _f():\n    import scepsy_serve.gateway\n", "Packages point one way"),
    # the data model importing a stage of its own package
    ("scepsy_opt/traces.py", "from scepsy_opt.planning import milp\n", "data model"),
    # packing importing a formulation
    ("scepsy_place/packing/bounds.py", "import scepsy_place.formulations.loop\n", "scepsy_place:"),
])
def test_an_upward_import_breaks_a_contract(tmp_path: Path, module: str, line: str,
                                            broken: str) -> None:
    """The contracts catch what they are for: each planted import breaks its contract."""
    src = tmp_path / "src"
    shutil.copytree(SRC, src, ignore=shutil.ignore_patterns("__pycache__", "data"))
    with (src / module).open("a") as f:
        f.write("\n" + line)
    run = lint_imports(src)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "0 broken" not in run.stdout
    report = run.stdout.split("Broken contracts", 1)[1]
    assert broken in " ".join(report.split())


def test_every_source_folder_is_a_package() -> None:
    """pyproject's package discovery is ``find`` under src/: every layer is a package there,
    and so is every folder of Python files under a layer (``scepsy_opt.planning``), which
    ``find`` only discovers with its ``__init__.py``."""
    for pkg in LAYERS:
        assert (SRC / pkg / "__init__.py").is_file(), pkg
    folders = {p.parent for pkg in LAYERS for p in (SRC / pkg).rglob("*.py")}
    assert sorted(str(d.relative_to(SRC)) for d in folders
                  if not (d / "__init__.py").is_file()) == []
    setuptools = pytest.importorskip("setuptools")
    assert set(setuptools.find_packages(where=str(SRC))) >= {
        ".".join(d.relative_to(SRC).parts) for d in folders}
    assert {p.name for p in SRC.iterdir() if (p / "__init__.py").is_file()} == set(LAYERS)
