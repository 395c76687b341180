"""Every example in README.md and docs/*.md runs.

```python blocks execute in order, one namespace per file, in a scratch folder that sees the
repository's ``datasets/``; a block preceded by ``<!-- file: NAME -->`` is written there as NAME
first. A page with ``<!-- requires: MODULE ... -->`` is skipped where a module is missing. ```console lines starting with ``$ scepsy`` run through the CLI and must exit 0.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from scepsy.cli import main

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
FILE_BLOCK = re.compile(r"^<!-- file: (\S+) -->\n```\w+\n(.*?)^```", re.S | re.M)
REQUIRES = re.compile(r"^<!-- requires: ([\w. ]+) -->$", re.M)


def _requirements(path: Path) -> None:
    """Skip a page whose examples need optional packages (``<!-- requires: torch ... -->``)
    where they are not installed."""
    for line in REQUIRES.findall(path.read_text()):
        for module in line.split():
            pytest.importorskip(module)


def _scratch(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "datasets").symlink_to(REPO / "datasets")
    for name, body in FILE_BLOCK.findall(path.read_text()):
        (tmp_path / name).write_text(body)
    monkeypatch.chdir(tmp_path)


def _blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(path.read_text()) if kind == lang]


@pytest.mark.parametrize("path", [d for d in DOCS if _blocks(d, "python")], ids=lambda p: p.name)
def test_python_examples_run(path, monkeypatch, tmp_path, capsys):
    blocks = _blocks(path, "python")
    _requirements(path)
    _scratch(path, tmp_path, monkeypatch)
    namespace: dict = {"__name__": "__doc_example__"}
    for body in blocks:
        exec(compile(body, str(path), "exec"), namespace)


def _commands(path: Path) -> list[str]:
    return [ln[2:] for body in _blocks(path, "console") for ln in body.splitlines()
            if ln.startswith("$ scepsy ")]


@pytest.mark.parametrize("path", [d for d in DOCS if _commands(d)], ids=lambda p: p.name)
def test_console_examples_exit_zero(path, monkeypatch, tmp_path, capsys):
    lines = _commands(path)
    _requirements(path)
    _scratch(path, tmp_path, monkeypatch)
    for line in lines:
        assert main(shlex.split(line)[1:]) == 0, line
