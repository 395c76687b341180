"""File helpers: atomic writes keep the usual permissions; unreadable inputs are InputErrors."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.errors import NAME_PATTERN, InputError, check_name
from scepsy_common.files import atomic_write_text, parse_json, parse_yaml, read_text


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


# --- one loader for every YAML/JSON file: duplicate keys, one-line messages -------------------

_keys = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=6,
                 unique=True)


@settings(max_examples=60, derandomize=True, deadline=None)
@given(keys=_keys, data=st.data())
def test_yaml_and_json_reject_a_repeated_key_and_name_it(keys: list[str], data) -> None:
    values = data.draw(st.lists(st.integers(-5, 5), min_size=len(keys), max_size=len(keys)))
    doc = dict(zip(keys, values, strict=True))
    lines = [f"{k}: {v}" for k, v in doc.items()]
    # without a repeat the project's loader agrees with PyYAML's and json's own
    assert parse_yaml("\n".join(lines) + "\n", "f.yaml") == yaml.safe_load("\n".join(lines))
    assert parse_json(json.dumps(doc), "f.json") == doc
    # a key repeated anywhere later: an error naming the key (and, for YAML, its second line)
    i = data.draw(st.integers(0, len(keys) - 1))
    at = data.draw(st.integers(i + 1, len(lines)))
    twice = [*lines[:at], f"{keys[i]}: 99", *lines[at:]]
    with pytest.raises(InputError) as info:
        parse_yaml("\n".join(twice) + "\n", "f.yaml")
    assert (info.value.source, info.value.field) == ("f.yaml", f"line {at + 1}: {keys[i]}")
    assert "duplicate key" in str(info.value)
    text = "{" + ", ".join([*(json.dumps(k) + ": 0" for k in keys), json.dumps(keys[i]) + ": 1"]) + "}"
    with pytest.raises(InputError) as info:
        parse_json(text, "f.json")
    assert (info.value.source, info.value.field) == ("f.json", keys[i])


def test_a_repeated_key_in_a_nested_mapping_is_found_too() -> None:
    with pytest.raises(InputError, match=r"f\.yaml: line 3: b: expected each key once"):
        parse_yaml("a:\n  b: 1\n  b: 2\n", "f.yaml")
    with pytest.raises(InputError, match=r"f\.json: b: expected each key once"):
        parse_json('{"a": [{"b": 1, "b": 2}]}', "f.json")


@settings(max_examples=200, derandomize=True, deadline=None)
@given(text=st.text(max_size=12))
def test_names_accepted_exactly_by_the_pattern_and_messages_stay_one_line(text: str) -> None:
    ok = bool(re.fullmatch(NAME_PATTERN, text))
    try:
        assert check_name(text, "f.yaml", f"llms.{text}") == text
        accepted = True
    except InputError as exc:
        accepted = False
        assert "\n" not in str(exc) and "\r" not in str(exc)
        assert str(exc).startswith("f.yaml: llms.")
    assert accepted == ok


def test_every_character_a_shell_gives_meaning_to_is_refused() -> None:
    for ch in " ;|&$`'\"()<>*?!#~{}[]\\\n\t\r=,%^":
        with pytest.raises(InputError):
            check_name(f"a{ch}b", "f.yaml", "name")
    for good in ("rag", "qwen2.5-7b", "A100-80GB", "BAAI/bge-reranker-large", "hgx_0", "a:b+c"):
        assert check_name(good, "f.yaml", "name") == good


def test_replace_folder_swaps_whole_and_leaves_the_old_one_on_any_error(tmp_path):
    from scepsy_common.files import replace_folder

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")

    def fill(folder):
        (folder / "new.txt").write_text("new")

    def broken(folder):
        fill(folder)
        raise RuntimeError("half-way")

    def refuse():
        raise ValueError("no longer allowed")

    for bad in ({"fill": broken}, {"fill": fill, "check": refuse}):
        with pytest.raises((RuntimeError, ValueError)):
            replace_folder(out, bad.pop("fill"), **bad)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary left
        assert [p.name for p in out.iterdir()] == ["old.txt"]
    assert replace_folder(out, fill, mode=0o750) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert out.stat().st_mode & 0o777 == 0o750


def test_atomic_write_flushes_to_disk_before_the_rename(tmp_path, monkeypatch):
    """fsync of the temporary file comes before the rename that publishes it: a crash between
    them leaves the old file, never a name pointing at bytes not yet on disk."""
    import scepsy_common.files as files

    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(files.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(files.os, "replace",
                        lambda a, b: (calls.append("replace"), real_replace(a, b)))
    atomic_write_text(tmp_path / "out.txt", "x")
    assert calls == ["fsync", "replace"]


def _pngs(names: list[str], fail_at: int | None = None):
    def fill(tmp):
        out = []
        for i, n in enumerate(names):
            if i == fail_at:
                raise RuntimeError("the renderer failed")
            (tmp / n).write_text(f"new {n}")
            out.append(tmp / n)
        return out
    return fill


@pytest.mark.parametrize("exists", [True, False])
def test_write_files_into_all_or_none(tmp_path, exists):
    from scepsy_common.files import write_files_into

    figs = tmp_path / "deep" / "figs"
    if exists:
        figs.mkdir(parents=True)
        (figs / "a.png").write_text("old a")
        (figs / "keep.txt").write_text("the user's")
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(RuntimeError):
        write_files_into(figs, _pngs(["a.png", "b.png"], fail_at=1))
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # no temp folder, no new file
    if exists:
        assert (figs / "a.png").read_text() == "old a"
    got = write_files_into(figs, _pngs(["a.png", "b.png"]))
    assert got == [figs / "a.png", figs / "b.png"]
    assert (figs / "a.png").read_text() == "new a.png"
    assert sorted(p.name for p in figs.iterdir()) == (
        ["a.png", "b.png", "keep.txt"] if exists else ["a.png", "b.png"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep"]  # nothing left beside


def test_write_files_into_refuses_a_file(tmp_path):
    from scepsy_common.files import write_files_into

    (tmp_path / "figs").write_text("a file")
    with pytest.raises(InputError, match="a path for a folder"):
        write_files_into(tmp_path / "figs", _pngs(["a.png"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figs"]
