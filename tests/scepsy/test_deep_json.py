"""A file nested too deeply for Python's JSON reader (a RecursionError inside ``json``) is bad
input to every reader of a JSON file: one line naming the file, exit 2, no traceback."""

from __future__ import annotations

import pytest

from conftest import run_cli

DEEP = "[" * 200_000


@pytest.mark.parametrize("argv", [
    ("profile", "fit", "--measurements", "{f}.jsonl", "--out", "out.json"),
    ("profile", "calibrate", "--serve-curve", "{f}.json", "--curves", "x.json", "--out", "o.yaml"),
    ("trace", "import", "{f}.jsonl", "--out", "out.jsonl"),
    ("report", "{f}.json", "--out", "r"),
    ("launch", "{f}.json", "--target", "shell", "--out", "l"),
])
def test_a_deeply_nested_file_is_refused_naming_it(tmp_path, argv):
    deep = tmp_path / "deep"
    args = [a.replace("{f}", str(deep)) for a in argv]
    for a in args:
        if a.startswith(str(deep)):
            (tmp_path / a).write_text(DEEP)
    args = [a if a.startswith(str(deep)) or a.startswith("-") or "." not in a
            else str(tmp_path / a) for a in args]
    code, _, err = run_cli(*args)
    assert code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert str(deep) in err and "deep" in err, err
