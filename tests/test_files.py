"""File helpers: atomic writes keep the usual permissions; unreadable inputs are InputErrors."""

from __future__ import annotations

import os
import stat

import pytest

from scepsy_profile.errors import InputError
from scepsy_profile.files import atomic_write_text, read_text


def test_atomic_write_gives_the_umask_mode_and_replaces(tmp_path):
    old = os.umask(0o022)
    try:
        path = tmp_path / "out.txt"
        atomic_write_text(path, "one")
        atomic_write_text(path, "two")
    finally:
        os.umask(old)
    assert path.read_text() == "two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


@pytest.mark.parametrize("kind", ["missing", "directory", "binary"])
def test_read_text_names_the_file_and_what_was_expected(tmp_path, kind):
    path = tmp_path / "in.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError) as err:
        read_text(path, "curves file (JSON)")
    assert str(path) in str(err.value) and "curves file" in str(err.value)
