"""The resumable profile store: one JSON line per measured (or failed) point, durable as measured.

A sweep writes its :class:`~scepsy_profile.profiling.records.ProfileRecord` lines through a
:class:`ProfileStore`::

    with ProfileStore("llama.profile.jsonl") as store:   # locks the store (StoreLockedError)
        done = finished(store.records, retry_failed=False)
        store.append(record)                             # written, flushed and fsynced

and anyone reads it back with :func:`read_store`, whose :class:`StoreContents` keeps every valid
record and lists each bad line with its number (the rest is kept). What a sweep killed at any
moment leaves behind is always readable: every appended line is on disk before
:meth:`ProfileStore.append` returns, and the one line a kill may cut short (no newline at the
end) is reported by :func:`read_store`, left out with a warning by :func:`checked_store` (what
fitting reads) and cut off when the store is next opened for writing.

One store holds at most one finished record per point (:meth:`ProfileRecord.key`): a point
measured ``ok`` stays so; a ``failed`` one may be measured again (``--retry-failed``), and the
later record supersedes it. :func:`store_measurements` turns a store into the measurements and
catalog that curve fitting needs.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from scepsy_common.errors import InputError, Name, validated
from scepsy_common.files import parse_json
from scepsy_profile.catalog import Catalog, default_catalog
from scepsy_profile.fitted import FittedLatencyModel, fit_latency_model
from scepsy_profile.hardware import GPUSpec
from scepsy_profile.measurements import MAX_BATCH, MAX_TOKENS, Measurement, Phase
from scepsy_profile.models import DTYPE_BYTES, ModelSpec, shape_record_fields
from scepsy_profile.profiling.devices import RATE_FIELDS, host_device_spec
from scepsy_profile.profiling.models import EngineModel, profiled_name
from scepsy_profile.profiling.records import PointKey, ProfileRecord, Status

LOCK_SUFFIX = ".lock"
"""The lock file of store ``PATH`` is ``PATH.lock``; it holds the pid of the sweep writing."""

_EXPECTED = "profile store (.jsonl)"
_CUT_SHORT = "cut short"


class StoreLockedError(InputError):
    """Another sweep (another process, or another open store in this one) is writing the store."""

    def __init__(self, store: Path, holder: int | None) -> None:
        who = ("a process" if holder is None else f"this process (pid {holder})"
               if holder == os.getpid() else f"process {holder}")
        super().__init__(str(store), "", f"a profile store no other sweep is writing; {who} "
                         f"holds its lock {store}{LOCK_SUFFIX} (wait for that sweep to end or stop "
                         "it: two sweeps never write one store)")
        self.holder = holder


_ConfigLine = create_model(  # the architecture a record was measured with (EngineModel.config)
    "_ConfigLine",
    __config__=ConfigDict(extra="forbid", frozen=True, strict=True),
    architecture=(Name, ...),
    **shape_record_fields(),
    tied_embeddings=(bool, ...),
    dtype=(Literal[tuple(DTYPE_BYTES)], ...),
)


class _RecordLine(BaseModel):
    """Schema of one store line (validation at the boundary, both ways)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    engine: Name
    engine_version: str
    model: Name
    scale: float = Field(gt=0.0, le=1.0)
    config: _ConfigLine  # type: ignore[valid-type]
    device: Name
    tp: int = Field(ge=1, le=1024)
    share: float = Field(gt=0.0, le=1.0)
    phase: Phase
    batch: int = Field(ge=1, le=MAX_BATCH)
    tokens: int = Field(ge=1, le=MAX_TOKENS)
    status: Status
    latency_ms: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    iqr_ms: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    samples_ms: list[Annotated[float, Field(gt=0.0, allow_inf_nan=False)]] = Field(
        default_factory=list)
    method: str = ""
    error: str = ""
    elapsed_s: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    device_detail: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _status_fields(self) -> _RecordLine:
        if self.status == "ok" and (self.latency_ms is None or self.iqr_ms is None):
            raise ValueError("latency_ms and iqr_ms on an ok record")
        if self.status == "failed" and (self.latency_ms is not None or not self.error):
            raise ValueError("an error and no latency_ms on a failed record")
        return self

    def record(self) -> ProfileRecord:
        raw = self.model_dump()
        return ProfileRecord(**{**raw, "samples_ms": tuple(raw["samples_ms"])})


def encode_record(record: ProfileRecord, source: str = "profile record") -> str:
    """The store line of ``record`` (sorted keys, newline-terminated); a record that
    :func:`read_store` would reject raises :class:`InputError` instead of being written."""
    raw = record.to_json()
    validated(_RecordLine, raw, source)
    return json.dumps(raw, sort_keys=True, allow_nan=False) + "\n"


@dataclass(frozen=True, slots=True)
class StoreContents:
    """What a store holds: one record per point and the lines that could not be read."""

    source: str
    records: tuple[ProfileRecord, ...]
    """Per point, its last ``ok`` record, else its last ``failed`` one; in the order of the
    lines they come from."""
    problems: tuple[tuple[int, str], ...] = ()
    """``(line number, what is wrong)`` for every line left out: not JSON, not a valid record,
    cut short (the last line, without its newline), or a second record of a point already ok."""


def read_store(path: str | os.PathLike[str]) -> StoreContents:
    """Read a profile store: every valid record kept, every bad line in ``problems``.

    A missing or unreadable file is an :class:`InputError`; a bad line never is."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
        raise InputError(str(p), "", f"an existing, readable {_EXPECTED}") from None
    return _parse(data, str(p))


def checked_store(path: str | os.PathLike[str],
                  warn: Callable[[str], None] | None = None) -> StoreContents:
    """:func:`read_store` for fitting: a last line cut short is left out with a warning, any
    other bad line is an :class:`InputError`.

    A last line cut short (a sweep killed while writing it) is left out with one warning,
    ``warn(message)`` (default: one line on stderr), naming the file and the line and saying
    that rerunning ``scepsy profile run`` with the same store completes the sweep; the result's
    :attr:`StoreContents.problems` keeps it. Any other bad line is an :class:`InputError`
    naming the file, the line and the field, and saying what to do."""
    contents = read_store(path)
    bad = [(n, m) for n, m in contents.problems if not m.startswith(_CUT_SHORT)]
    if bad:
        line, message = bad[0]
        more = len(bad) - 1
        raise InputError(contents.source, f"line {line}",
                         f"a valid profile record ({message}"
                         + (f"; {more} more bad line(s)" if more else "") + "); delete that "
                         "line and rerun `scepsy profile run` with this store as --out to "
                         "measure its point again")
    for line, _ in contents.problems:
        (warn or _stderr)(
            f"{contents.source}: line {line} was cut short (a sweep was stopped while writing "
            "it) and is left out; rerunning `scepsy profile run` with the same --out "
            f"{contents.source} completes the sweep")
    return contents


def _stderr(message: str) -> None:
    print(f"scepsy: warning: {message}", file=sys.stderr, flush=True)


def finished(records: tuple[ProfileRecord, ...] | list[ProfileRecord],
             retry_failed: bool) -> set[PointKey]:
    """The points a resumed sweep skips: every ``ok`` one, and the ``failed`` ones unless
    ``retry_failed``."""
    return {r.key() for r in records if r.status == "ok" or not retry_failed}


class ProfileStore:
    """A store opened for writing by one sweep (a context manager).

    Opening takes an exclusive lock on ``PATH.lock`` (``flock``, which the OS releases when the
    holder exits or is killed, so a lock file left by a killed sweep does not block); a second
    opener, in another process or this one, gets :class:`StoreLockedError` naming the holder's
    pid. (A process the holder forked without exec, e.g. an engine worker, shares its lock
    until it exits.) Opening then reads the store and, when its last line was cut short by a
    kill, cuts it off so that appends start on a fresh line; :attr:`warnings` says so.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.lock_path = self.path.with_name(self.path.name + LOCK_SUFFIX)
        self.problems: tuple[tuple[int, str], ...] = ()
        self.warnings: tuple[str, ...] = ()
        self._latest: dict[PointKey, ProfileRecord] = {}
        self._fd: int | None = None
        self._lock_fd: int | None = None

    def __enter__(self) -> ProfileStore:
        if self._lock_fd is not None:
            raise RuntimeError(f"profile store {self.path} is already open")
        lock_was_there = self.lock_path.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = _lock(self.lock_path, self.path)
            self._open()
        except (PermissionError, IsADirectoryError, NotADirectoryError, FileExistsError):
            self.close()
            raise InputError(str(self.path), "", f"a {_EXPECTED} this user can create and "
                             f"write, with its lock file {self.lock_path.name}") from None
        except InputError:  # refused as it is: the lock file made for it goes again
            self.close()
            if not lock_was_there:
                self.lock_path.unlink(missing_ok=True)
            raise
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
        if created:
            _fsync_dir(self.path.parent)
        data = _read_all(self._fd)
        if data.strip() and not data.lstrip().startswith(b"{"):
            raise InputError(str(self.path), "line 1", f"a {_EXPECTED} (profile records, one "
                             "JSON object per line) or a new file; this file holds something "
                             "else and was left as it is: choose another --out")
        keep = data.rfind(b"\n") + 1
        contents = _parse(data[:keep], str(self.path))
        if contents.problems and not contents.records:  # JSON lines, but none a record
            n, why = contents.problems[0]
            raise InputError(str(self.path), f"line {n}", f"a {_EXPECTED} (profile records, "
                             "one JSON object per line) or a new file; no line of this file is "
                             f"a profile record ({why}), so it holds something else and was "
                             "left as it is: choose another --out")
        warnings: list[str] = []
        if keep < len(data):
            os.ftruncate(self._fd, keep)
            os.fsync(self._fd)
            line = data.count(b"\n") + 1
            warnings.append(f"{self.path}: line {line}: cut off "
                            f"{len(data) - keep} bytes without a newline (a sweep stopped while "
                            "writing them; that point is measured again)")
        self.problems = contents.problems
        warnings.extend(f"{self.path}: line {n}: {msg} (line kept, not used)"
                        for n, msg in contents.problems)
        self.warnings = tuple(warnings)
        self._latest = {r.key(): r for r in contents.records}

    def close(self) -> None:
        """Close the store and release its lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            _unlock(self._lock_fd)
            self._lock_fd = None

    @property
    def records(self) -> tuple[ProfileRecord, ...]:
        """The store's records, one per point (see :attr:`StoreContents.records`), appends
        included."""
        return tuple(self._latest.values())

    def contents(self) -> StoreContents:
        """The store as :func:`read_store` would read it now (problems as found at opening)."""
        return StoreContents(str(self.path), self.records, self.problems)

    def append(self, record: ProfileRecord) -> None:
        """Write ``record`` as one line, flushed and fsynced before this returns.

        A point already measured ``ok`` raises :class:`ValueError` (one finished record per
        point); one recorded ``failed`` may be appended again (a retry supersedes it)."""
        if self._fd is None:
            raise RuntimeError(f"profile store {self.path} is not open")
        key = record.key()
        prev = self._latest.get(key)
        if prev is not None and prev.status == "ok":
            raise ValueError(f"{self.path}: point {_describe(key)} is already measured; a store "
                             "holds one finished record per point")
        line = encode_record(record, str(self.path)).encode("utf-8")
        _append_line(self._fd, line)
        self._latest.pop(key, None)
        self._latest[key] = record


def store_measurements(contents: StoreContents, catalog: Catalog | None = None,
                       ) -> tuple[tuple[Measurement, ...], Catalog]:
    """The ``ok`` records as :class:`Measurement` s, and ``catalog`` (default: the bundled one)
    extended with what they were measured on, so that curves can be fitted and checked.

    * Models: a shrunk model (``scale < 1``), or one the catalog does not know, is added as the
      :class:`ModelSpec` of the record's ``config``, named :attr:`ProfileRecord.profiled_name`.
    * Devices: one the catalog does not know (``cpu``) is added as a :class:`GPUSpec` with the
      largest ``device_detail["memory_gib"]`` of its records and an NVLink domain of the largest
      TP degree measured or ``device_detail["count"]``. Its ``bf16_tflops``, ``hbm_gbps`` and
      ``interconnect_gbps`` come from ``device_detail`` when recorded, else 1.0: measured curves
      do not use them (only roofline estimates would).

    Two records of one profiled model with different architectures are an :class:`InputError`.
    """
    base = catalog or default_catalog()
    ok = [r for r in contents.records if r.status == "ok"]
    models: dict[str, ModelSpec] = {}
    for r in ok:
        if r.scale == 1.0 and base.has_model(r.model):
            continue
        spec = EngineModel(name=r.model, scale=r.scale, **r.config).model_spec()
        if models.setdefault(spec.name, spec) != spec:
            raise InputError(contents.source, f"model {spec.name}",
                             "one architecture (config) per profiled model", r.config)
    out = base.merge(Catalog(models=models))
    for device in sorted({r.device for r in ok}):
        if not out.has_gpu(device):
            out = out.with_gpu(_device_spec(device, [r for r in ok if r.device == device],
                                            contents.source))
    return tuple(r.measurement() for r in ok), out


# ------------------------------------------------------------------------------- internals

def _parse(data: bytes, source: str) -> StoreContents:
    latest: dict[PointKey, tuple[int, ProfileRecord]] = {}
    problems: list[tuple[int, str]] = []
    lines = data.split(b"\n")
    for n, raw in enumerate(lines, start=1):
        if n == len(lines) and raw:
            problems.append((n, _CUT_SHORT + " (no newline at the end: the sweep was stopped "
                                "while writing it)"))
            break
        if not raw.strip():
            continue
        try:
            rec = _decode(raw, source)
        except InputError as exc:
            problems.append((n, _message(exc)))
            continue
        key = rec.key()
        prev = latest.get(key)
        if prev is not None and prev[1].status == "ok":
            kept = "the last ok one is kept" if rec.status == "ok" else "ignored"
            problems.append((n, f"a second record of point {_describe(key)}, measured ok on "
                                f"line {prev[0]} ({kept})"))
            if rec.status != "ok":
                continue
        latest.pop(key, None)
        latest[key] = (n, rec)
    return StoreContents(source, tuple(r for _, r in latest.values()), tuple(problems))


def _decode(raw: bytes, source: str) -> ProfileRecord:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(source, "", "UTF-8 text") from None
    obj = parse_json(text, source)
    if not isinstance(obj, dict):
        raise InputError(source, "", "a JSON object (one profile record)", type(obj).__name__)
    return validated(_RecordLine, obj, source).record()


def _message(exc: InputError) -> str:
    # parse_json names the line inside the text it was given: always line 1 here
    field = f"{exc.field}: " if exc.field and not exc.field.startswith("line ") else ""
    got = f" (got {exc.got!r})" if exc.got is not None else ""
    return f"{field}expected {exc.expected}{got}"


def _describe(key: PointKey) -> str:
    engine, model, scale, device, tp, share, phase, batch, tokens = key
    return (f"{engine} {profiled_name(model, scale)} on {device} tp={tp} share={share:g} {phase} "
            f"batch={batch} tokens={tokens}")


def _device_spec(device: str, records: list[ProfileRecord], source: str) -> GPUSpec:
    def values(name: str) -> list[float]:
        vals = [r.device_detail.get(name) for r in records]
        return [float(v) for v in vals
                if isinstance(v, int | float) and not isinstance(v, bool) and v > 0]

    memory = values("memory_gib")
    if not memory:
        raise InputError(source, f"device {device}: device_detail.memory_gib",
                         "the memory of a device the catalog does not know, recorded by the sweep")
    domain = max([r.tp for r in records] + [int(c) for c in values("count")])
    rates = {k: max(v) for k in RATE_FIELDS if (v := values(k))}
    return host_device_spec(device, max(memory), domain, **rates)


def _lock(lock_path: Path, store: Path) -> int:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        raise StoreLockedError(store, int(text) if text.isdigit() else None) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


def _unlock(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)  # no pid left behind: the lock file alone never blocks anyone
    finally:
        os.close(fd)  # releases the flock


def _read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _append_line(fd: int, line: bytes) -> None:
    """Append ``line`` whole and fsync it; on any failure the file is cut back to where it
    was, so that a half-written line never precedes the next one."""
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.ftruncate(fd, start)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fit_store(path: str | os.PathLike[str], *, seed: int = 0,
              n_jobs: int = 1) -> FittedLatencyModel:
    """The latency curves of every curve of a store's ``ok`` records
    (:func:`~scepsy_profile.fitted.fit_latency_model` on :func:`store_measurements` of the
    :func:`checked_store`): what ``scepsy profile fit --measurements STORE`` fits."""
    rows, _ = store_measurements(checked_store(path))
    return fit_latency_model(rows, seed=seed, n_jobs=n_jobs, source=str(path))
