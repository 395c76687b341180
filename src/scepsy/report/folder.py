"""The report folder: written whole into a temporary folder beside it, then renamed into place,
so that a reader sees the old report or the new one, never a mix; and never over anything but
an earlier report.

A folder is an earlier report when it holds nothing but ``index.html`` (carrying
:data:`GENERATOR`) and figures (``.png`` or ``.svg`` files: :data:`FIGURE_SUFFIXES`). An
empty folder may be written into; any other folder, or a file, at the output path is an
:class:`~scepsy_common.errors.InputError` before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from scepsy_common.errors import InputError
from scepsy_common.files import replace_folder

__all__ = ["FIGURE_SUFFIXES", "GENERATOR", "INDEX", "check_out", "is_report", "write_folder"]

INDEX = "index.html"
GENERATOR = '<meta name="generator" content="scepsy report">'
FIGURE_SUFFIXES = (".png", ".svg")
EXPECTED = ("a new folder, an empty one or an earlier scepsy report's (index.html and PNG or "
            "SVG figures only); scepsy report never overwrites other files")


def is_report(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier report (module docstring) or nothing."""
    entries = list(folder.iterdir())
    if not entries:
        return True
    if any(not e.is_file() or e.is_symlink() or not (e.name == INDEX or e.suffix in FIGURE_SUFFIXES)
           for e in entries):
        return False
    index = folder / INDEX
    try:
        return index.is_file() and GENERATOR in index.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False


def check_out(out: Path) -> None:
    """An :class:`InputError` unless a report may be written at ``out`` (module docstring)."""
    if out.is_symlink():  # replacing it would replace the link, not write where it points
        raise InputError(str(out), "", f"{EXPECTED}, not a symbolic link: give the folder it "
                         f"points to ({os.readlink(out)}) instead", "a symbolic link")
    if out.exists() and not out.is_dir():
        raise InputError(str(out), "", EXPECTED, "a file")
    if out.is_dir() and not is_report(out):
        raise InputError(str(out), "", EXPECTED, "a folder with other files")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(str(out), "", f"a path under a folder ({parent} is a file)")


def write_folder(out: Path, fill: Callable[[Path], None]) -> Path:
    """Check ``out`` (:func:`check_out`), let ``fill`` write the report into a new temporary
    folder beside it, then put that folder in ``out``'s place (an earlier report there is
    removed; :func:`scepsy_common.files.replace_folder`). Returns ``out``; on any error the
    earlier report stays and nothing else is left behind."""
    check_out(out)
    filling = False

    def run(tmp: Path) -> None:
        nonlocal filling
        filling = True
        fill(tmp)

    try:
        return replace_folder(out, run, check=lambda: check_out(out))
    except OSError as exc:
        if filling:
            raise
        raise InputError(str(out), "", f"a folder that can be written ({exc.strerror})") from None
