"""Reading and writing the project's files: clear errors in, atomic writes out."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import yaml

from scepsy_common.errors import InputError


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
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one.

    What is at ``path`` must be a regular file (or nothing): a folder, a device (``/dev/null``)
    or another special file is never replaced. That, and a write the system refuses (no space
    left, no permission, a read-only file system), is an :class:`InputError` naming ``path``,
    with nothing left behind."""
    p = Path(path)
    if p.exists() and not p.is_file():
        what = "a folder" if p.is_dir() else "a device or special file, which scepsy never replaces"
        raise InputError(str(p), "", f"a path for a file (this is {what})")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    except OSError as exc:
        raise _unwritable(p, exc) from None
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual mode
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes on disk before the name points at them
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise _unwritable(p, exc) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_files_into(folder: Path, fill: Callable[[Path], Iterable[Path]]) -> list[Path]:
    """Write some files into ``folder`` all or none (``scepsy bench control --figures``):
    ``fill`` writes them into a new temporary folder beside ``folder`` (on the same file system)
    and returns their paths; only when it has written every one are they flushed to disk and
    renamed into ``folder`` (made if need be), each replacing the file of its name whole. Other
    files in ``folder`` stay. On any error in ``fill`` nothing is left behind and nothing in
    ``folder`` has changed; a rename the system refuses is an :class:`InputError` naming
    ``folder``. Returns the paths in ``folder``."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise InputError(str(folder), "", "a path for a folder (this is "
                         f"{'a symbolic link' if folder.is_symlink() else 'a file'})")
    anchor = folder.parent
    while not anchor.exists() and anchor != anchor.parent:
        anchor = anchor.parent
    try:
        tmp = Path(tempfile.mkdtemp(dir=anchor, prefix=f".{folder.name}.", suffix=".tmp"))
    except OSError as exc:
        raise _unwritable(folder, exc) from None
    try:
        made = list(fill(tmp))
        for f in made:
            if f.parent != tmp:
                raise ValueError(f"write_files_into: {f} is not a file of {tmp}")
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        folder.mkdir(parents=True, exist_ok=True)
        out = []
        for f in made:
            os.replace(f, folder / f.name)
            out.append(folder / f.name)
        return out
    except OSError as exc:
        raise _unwritable(folder, exc) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unwritable(path: Path, exc: OSError) -> InputError:
    """A write the system refused, as bad input naming the path and the system's reason."""
    return InputError(str(path), "", f"a path this user can write ({exc.strerror or exc})")


def failed_path(path: str | os.PathLike[str]) -> Path:
    """Where a failed run's output goes when ``path`` already holds a result it must not
    destroy: ``NAME.EXT`` -> ``NAME.failed.EXT`` (``NAME`` -> ``NAME.failed.json``)."""
    p = Path(path)
    return p.with_name(f"{p.stem if p.suffix else p.name}.failed{p.suffix or '.json'}")


def failed_run_output(path: str | os.PathLike[str]) -> Path:
    """Where a failed run writes its output ``path``: ``path`` itself when nothing is there,
    else :func:`failed_path` beside it (a failed run never destroys an earlier result)."""
    p = Path(path)
    return failed_path(p) if p.exists() else p


def replace_folder(out: Path, fill: Callable[[Path], None], *, mode: int | None = None,
                   check: Callable[[], None] | None = None) -> Path:
    """Write the folder ``out`` whole, so that readers see the old one or the whole new one:
    ``fill`` writes into a new temporary folder beside it (mode ``mode``, default the umask's),
    ``check`` (the caller's test that ``out`` may still be replaced) runs once more, then the
    new folder takes ``out``'s place; what was there is moved aside and removed, and put back
    if the rename fails. On any error nothing is left but what was at ``out``."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        what = "a symbolic link" if out.is_symlink() else "a file"
        raise InputError(str(out), "", f"a path for a folder, which is replaced whole (this is "
                         f"{what}; give the folder itself or a new path)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    except OSError as exc:
        raise _unwritable(out, exc) from None
    try:
        os.chmod(tmp, 0o777 & ~_umask() if mode is None else mode)  # mkdtemp makes 0700
        fill(tmp)
        if check is not None:
            check()
        old = _swap(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _unwritable(out, exc) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


def _swap(new: Path, out: Path) -> Path | None:
    """Rename ``new`` to ``out``, moving what is at ``out`` aside first (returned, to be
    removed); on failure ``out`` is put back."""
    if not out.exists():
        os.replace(new, out)
        return None
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old"))
    os.replace(out, old)  # onto the empty folder just made
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)
        raise
    return old


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
            raw = parse_json(line, src)
        except InputError as exc:
            field = f"line {lineno}" + (f": {exc.field}" if exc.field and not
                                        exc.field.startswith("line ") else "")
            raise InputError(src, field, exc.expected.replace("valid JSON", "a JSON object"),
                             exc.got) from None
        if not isinstance(raw, dict):
            raise InputError(src, f"line {lineno}", f"a JSON object (one {what})",
                             type(raw).__name__)
        yield lineno, raw


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping key given twice (raised by :class:`UniqueKeyLoader`)."""

    def __init__(self, key: object, mark: yaml.Mark) -> None:
        super().__init__(None, None, f"found duplicate key {key!r}", mark)
        self.key = key


class UniqueKeyLoader(yaml.SafeLoader):
    """The safe YAML loader of every project file: a key given twice in one mapping is an error
    (plain YAML keeps the second value silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue  # unhashable key: the base constructor reports it
            if duplicate:
                raise DuplicateKeyError(key, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


# Numbers with an exponent are numbers, as in YAML 1.2 (1e15, -2E-3, 1.0e15, .5e3): YAML 1.1
# (PyYAML's) reads them as strings unless they have a dot and a signed exponent (1.0e+15).
_EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")
UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT,
                                      list("-+0123456789."))


class SafeDumper(yaml.SafeDumper):
    """``yaml.safe_dump``'s dumper that quotes every string :class:`UniqueKeyLoader` (and a
    YAML 1.2 reader) would read as a number (``0E0``, ``1e5``), so what is written reads back
    as written."""


SafeDumper.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT,
                                 list("-+0123456789."))


def dump_yaml(data: Any, **options: Any) -> str:
    """``yaml.safe_dump(data, **options)`` with :class:`SafeDumper`: it reads back the same
    through :func:`parse_yaml`."""
    return yaml.dump(data, Dumper=SafeDumper, **options)


def parse_yaml(text: str, source: str, loader: type = UniqueKeyLoader) -> Any:
    """Parsed YAML (or JSON) ``text``; a syntax error or a duplicate key names ``source`` and
    the line.

    ``loader`` must be ``yaml.SafeLoader`` or a subclass of it (default: :class:`UniqueKeyLoader`).
    """
    try:
        return yaml.load(text, Loader=loader)
    except DuplicateKeyError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else 0
        raise InputError(source, f"line {line}: {exc.key}",
                         "each key once per mapping (duplicate key)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(source, where, f"valid YAML ({problem})") from None
    except RecursionError:
        raise InputError(source, "", "valid YAML (nested too deeply)") from None
    except ValueError as exc:  # a scalar its constructor refuses: a 13th month, an integer
        why = "an integer of more than 4300 digits" if "digits" in str(exc) else str(exc)
        raise InputError(source, "", f"valid YAML ({why})") from None


def read_yaml(path: str | os.PathLike[str], expected: str, loader: type = UniqueKeyLoader) -> Any:
    """The parsed content of a YAML (or JSON) file; see :func:`parse_yaml`."""
    return parse_yaml(read_text(path, expected), str(path), loader)


def _json_int(text: str) -> int | float:
    """A JSON integer; one too long for Python's ``int`` (more than 4300 digits) reads as an
    infinity of its sign, which every field check refuses by name (instead of a ValueError)."""
    try:
        return int(text)
    except ValueError:
        return -math.inf if text.startswith("-") else math.inf


def parse_json(text: str, source: str) -> Any:
    """Parsed JSON ``text``: a syntax error or a key given twice in one object is an
    :class:`InputError` naming ``source`` and the line or the key (NaN and Infinity are read as
    numbers, for the field checks to reject by name)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                raise _DuplicateJSONKey(k)
            out[k] = v
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}", f"valid JSON ({exc.msg})") from None
    except _DuplicateJSONKey as exc:
        raise InputError(source, str(exc.args[0]),
                         "each key once per object (duplicate key)") from None
    except RecursionError:
        raise InputError(source, "", "valid JSON (nested too deeply)") from None


class _DuplicateJSONKey(Exception):
    pass


def read_json(path: str | os.PathLike[str], expected: str) -> Any:
    """The parsed content of a JSON file; see :func:`parse_json`."""
    return parse_json(read_text(path, expected), str(path))
