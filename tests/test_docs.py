"""Every example in README.md and docs/*.md runs: ```python blocks execute (one namespace per
file, in order, from the repository root) and ```console lines starting with ``$ scepsy`` exit 0."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from scepsy.cli import main

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def _blocks(path: Path, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(path.read_text()) if kind == lang]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_examples_run(path, monkeypatch, tmp_path, capsys):
    blocks = _blocks(path, "python")
    if not blocks:
        pytest.skip(f"{path.name} has no python example")
    monkeypatch.chdir(REPO)
    namespace: dict = {"__name__": "__doc_example__", "TMP": tmp_path}
    for body in blocks:
        exec(compile(body, str(path), "exec"), namespace)  # noqa: S102 - our own docs


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_console_examples_exit_zero(path, monkeypatch, tmp_path, capsys):
    lines = [ln[2:] for body in _blocks(path, "console") for ln in body.splitlines()
             if ln.startswith("$ scepsy ")]
    if not lines:
        pytest.skip(f"{path.name} has no scepsy console example")
    monkeypatch.chdir(REPO)
    for line in lines:
        argv = [a.replace("$TMP", str(tmp_path)) for a in shlex.split(line)[1:]]
        assert main(argv) == 0, line
