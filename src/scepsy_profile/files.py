"""Reading and writing the project's files: clear errors in, atomic writes out."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from scepsy_profile.errors import InputError


def read_text(path: str | os.PathLike[str], expected: str) -> str:
    """The text of a UTF-8 file, or an :class:`InputError` saying what was ``expected`` there."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        raise InputError(str(p), "", f"an existing, readable {expected}") from None
    except UnicodeDecodeError:
        raise InputError(str(p), "", f"a UTF-8 text file ({expected})") from None


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual mode
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_csv_rows(path: str | os.PathLike[str], expected: str,
                  required: tuple[str, ...] = ()) -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    """Header and ``(where, row)`` pairs of a CSV file; ``where`` reads ``row N (line L)``.

    Blank rows are skipped; a row with a different number of fields than the header, a missing
    ``required`` column, or no data row at all is an :class:`InputError` naming the file.
    """
    src = str(path)
    reader = csv.reader(io.StringIO(read_text(path, expected), newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise InputError(src, "header", "a CSV header line (file is empty)")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise InputError(src, f"column {missing[0]}", "a column of that name (missing)")
        rows: list[tuple[str, dict[str, str]]] = []
        for n, cells in enumerate(reader, start=1):
            where = f"row {n} (line {reader.line_num})"
            if not any(c.strip() for c in cells):
                continue
            if len(cells) != len(header):
                raise InputError(src, where, f"{len(header)} fields like the header", len(cells))
            rows.append((where, dict(zip(header, cells, strict=True))))
    except csv.Error as exc:
        raise InputError(src, "", f"a well-formed CSV file ({exc})") from None
    if not rows:
        raise InputError(src, "", "at least one data row")
    return header, rows


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def read_jsonl_objects(path: str | os.PathLike[str], expected: str,
                       what: str = "record") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file.

    A line that is not JSON, or not a JSON object, is an :class:`InputError` naming the file and
    the line; ``what`` says what one line holds (e.g. ``"call"``).
    """
    src = str(path)
    for lineno, line in enumerate(read_text(path, expected).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(src, f"line {lineno}", f"a JSON object ({exc.msg})") from None
        if not isinstance(raw, dict):
            raise InputError(src, f"line {lineno}", f"a JSON object (one {what})",
                             type(raw).__name__)
        yield lineno, raw


def parse_yaml(text: str, source: str, loader: type = yaml.SafeLoader) -> Any:
    """Parsed YAML (or JSON) ``text``; a syntax error names ``source`` and the line.

    ``loader`` must be ``yaml.SafeLoader`` or a subclass of it (e.g. one rejecting duplicate keys).
    """
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(source, where, f"valid YAML ({problem})") from None


def read_yaml(path: str | os.PathLike[str], expected: str, loader: type = yaml.SafeLoader) -> Any:
    """The parsed content of a YAML (or JSON) file; see :func:`parse_yaml`."""
    return parse_yaml(read_text(path, expected), str(path), loader)
