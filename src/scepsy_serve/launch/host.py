"""Running a rendered shell folder on this host (docs/launch.md): :func:`apply` runs one node's
``start.sh`` and returns the servers it started; :func:`stop` stops them (the node's
``stop.sh``, then checks that no process of theirs is left and their ports are free, and ends
any that are); :func:`running` does both around a block, stopping even on Ctrl-C.

What runs where comes from the folder itself (:func:`~scepsy_serve.launch.shell.replica_records`
reads the scripts); the run folder (logs, pid files) is ``run/`` in the folder, or
``$SCEPSY_RUN_DIR``, or the ``run_dir`` given.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from scepsy_common.errors import InputError
from scepsy_profile.profiling.processes import group_has, group_members
from scepsy_profile.profiling.server import port_in_use
from scepsy_serve.launch.renderers import MANIFEST, read_rendered
from scepsy_serve.launch.shell import (
    HEALTH_TIMEOUT_ENV,
    NAME,
    RUN_DIR_ENV,
    SERVER_ENV,
    STOP_GRACE_ENV,
    STOP_GRACE_S,
    ShellReplica,
    node_folder,
    replica_records,
)

PORT_FREE_WAIT_S = 10.0
OUTPUT_TAIL_LINES = 60


class LaunchError(RuntimeError):
    """A start that failed: the message ends with what start.sh said (its log tails)."""


@dataclass(frozen=True)
class StartedServer:
    name: str
    llm: str
    replica: int
    node: str
    pid: int
    port: int
    url: str  # OpenAI-compatible base URL on this host
    log: Path


@dataclass(frozen=True)
class AppliedRun:
    folder: Path
    node: str
    run_dir: Path
    servers: tuple[StartedServer, ...]
    startup_s: float
    output: str  # what start.sh printed


@dataclass(frozen=True)
class StopReport:
    """``stopped``: servers that ran and were stopped; ``left``: servers with a process still
    alive; ``busy_ports``: their ports something still listens on. ``ok`` when both are empty.
    ``stale``: ``(server, pid)`` of pid files whose process group runs but is not that server
    (its pid reused): not signalled, the pid file removed."""

    stopped: tuple[str, ...]
    left: tuple[str, ...]
    busy_ports: tuple[int, ...]
    output: str
    stale: tuple[tuple[str, int], ...] = ()

    @property
    def ok(self) -> bool:
        return not self.left and not self.busy_ports


def shell_folder(folder: str | os.PathLike[str]) -> tuple[Path, tuple[ShellReplica, ...]]:
    """``folder`` and its replicas, or an :class:`InputError` when it is not a folder written
    by ``scepsy launch --target shell``."""
    root = Path(folder)
    marker = root / MANIFEST
    expected = "a folder written by `scepsy launch --target shell`"
    if not root.is_dir() or not marker.is_file():
        raise InputError(str(root), "folder", expected)
    target = marker.read_text(encoding="utf-8").strip()
    if target != NAME:
        raise InputError(str(root), "folder", expected, f"a {target} folder")
    return root, replica_records(read_rendered(root))


def default_run_dir(folder: Path, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    return Path(env[RUN_DIR_ENV]) if env.get(RUN_DIR_ENV) else folder / "run"


def _run_dir(root: Path, run_dir: str | os.PathLike[str] | None) -> Path:
    return Path(run_dir) if run_dir is not None else default_run_dir(root)


def choose_node(nodes: Iterable[str], node: str | None, source: str) -> str:
    """The node this host is: ``node`` if it is one of ``nodes`` (the nodes that run a
    replica), the only one when ``node`` is None; else an :class:`InputError` about
    ``--node`` (``scepsy launch --apply`` checks it before anything is written)."""
    names = sorted(set(nodes))
    if node is None:
        if len(names) != 1:
            raise InputError(source, "--node", f"one of {', '.join(names)} (the plan has "
                             f"{len(names)} nodes: say which runs on this host)")
        return names[0]
    if node not in names:
        raise InputError(source, "--node", f"one of {', '.join(names)}", node)
    return node


def busy_ports(ports: Iterable[tuple[str, int]]) -> list[str]:
    """``NAME (port P)`` for each ``(name, port)`` something on this host already listens on
    (start.sh refuses to start then; ``scepsy launch --apply`` checks first)."""
    return [f"{name} (port {port})" for name, port in ports if port_in_use(port)]


def _choose_node(replicas: tuple[ShellReplica, ...], node: str | None, root: Path) -> str:
    return choose_node((r.node for r in replicas), node, str(root))


def _script_env(run_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    return {**os.environ, RUN_DIR_ENV: str(run_dir), **extra}


def _tail(text: str, lines: int = OUTPUT_TAIL_LINES) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _read_pid(runs: Path, name: str) -> int | None:
    """The process (group) id in server ``name``'s pid file, or None."""
    try:
        text = (runs / "pids" / f"{name}.pid").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def apply(folder: str | os.PathLike[str], node: str | None = None,
          timeout_s: float | None = None, *, run_dir: str | os.PathLike[str] | None = None,
          echo: TextIO | None = None) -> AppliedRun:
    """Run ``NODE/start.sh`` of ``folder`` here (``node``: the folder's only node when None)
    and return its servers once every one answers ``/health``. ``timeout_s`` overrides the
    plan's health timeout; ``echo`` receives start.sh's output as it comes. :class:`LaunchError`
    when the start fails (start.sh has stopped what it started by then); on an interrupt
    (Ctrl-C) start.sh is told to stop and the interrupt goes on."""
    root, replicas = shell_folder(folder)
    chosen = _choose_node(replicas, node, root)
    runs = _run_dir(root, run_dir)
    extra = {}
    if timeout_s is not None:
        if not (math.isfinite(timeout_s) and timeout_s > 0):
            raise InputError("apply", "--timeout-s", "a number of seconds > 0", timeout_s)
        extra[HEALTH_TIMEOUT_ENV] = str(math.ceil(timeout_s))
    script = root / node_folder(chosen) / "start.sh"
    t0 = time.monotonic()
    # its own session: a Ctrl-C reaches this process only, which then stops start.sh cleanly
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=_script_env(runs, extra), start_new_session=True, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if echo is not None:
                echo.write(line)
                echo.flush()
        proc.wait()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # start.sh stops what it started, then exits
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=60)
        raise
    out = "".join(lines)
    if proc.returncode != 0:
        raise LaunchError(f"{script} failed (exit {proc.returncode}):\n{_tail(out)}")
    runs = runs.resolve()
    servers = []
    for r in replicas:
        if r.node != chosen:
            continue
        pid = _read_pid(runs, r.name)
        if pid is None:
            raise LaunchError(f"{script} succeeded but left no pid file for {r.name} "
                              f"in {runs / 'pids'}")
        servers.append(StartedServer(r.name, r.llm, r.replica, r.node, pid, r.port,
                                     r.url,
                                     runs / "logs" / f"{r.name}.log"))
    return AppliedRun(root, chosen, runs, tuple(servers), time.monotonic() - t0, out)


def _live(pid: int) -> bool:
    """Whether a live (not zombie) process of group ``pid`` remains."""
    return bool(group_members(pid))


def _ours(pid: int, runs: Path, name: str) -> bool:
    """Whether a live process of group ``pid`` is server ``name`` started into ``runs`` (its
    environment holds start.sh's marker, :data:`~scepsy_serve.launch.shell.SERVER_ENV`): a
    stale pid file's group (the server gone, its pid reused) is not."""
    marker = str(runs.resolve() / "pids" / name)
    return group_has(pid, lambda proc: proc.environ().get(SERVER_ENV) == marker)


def running_servers(folder: str | os.PathLike[str], *,
                    run_dir: str | os.PathLike[str] | None = None) -> tuple[str, ...]:
    """The servers started from ``folder`` that still run here (none when ``folder`` is not a
    shell folder): a folder with running servers must not be rendered over (their pid files
    would go with it)."""
    try:
        root, replicas = shell_folder(folder)
    except InputError:
        return ()
    runs = _run_dir(root, run_dir)
    return tuple(r.name for r in replicas
                 if (pid := _read_pid(runs, r.name)) is not None
                 and _ours(pid, runs, r.name))


def stop(folder: str | os.PathLike[str], grace_s: float = STOP_GRACE_S, *,
         node: str | None = None, run_dir: str | os.PathLike[str] | None = None) -> StopReport:
    """Stop what :func:`apply` (or start.sh) started from ``folder`` on this host: each node's
    ``stop.sh`` (or ``node``'s only), then check that no process of a server's group is left
    (SIGKILL to any that is) and that its port is free. Idempotent: with nothing running it
    does nothing and reports ok. A pid file whose process group is not the server start.sh
    started (no process of it carries :data:`~scepsy_serve.launch.shell.SERVER_ENV`) is never
    signalled: stop.sh removes it and the report lists it as ``stale``."""
    root, replicas = shell_folder(folder)
    nodes = sorted({r.node for r in replicas}) if node is None else [
        _choose_node(replicas, node, root)]
    runs = _run_dir(root, run_dir)
    if not (math.isfinite(grace_s) and grace_s >= 0):
        raise InputError("stop", "--grace-s", "a number of seconds >= 0", grace_s)
    mine = [r for r in replicas if r.node in nodes]
    # only groups that are ours: a stale pid file's group is stop.sh's to report, never ours
    # to signal
    found = {r.name: p for r in mine if (p := _read_pid(runs, r.name)) is not None}
    pids = {n: p for n, p in found.items() if _ours(p, runs, n)}
    stale = tuple((n, p) for n, p in sorted(found.items()) if n not in pids and _live(p))
    running = sorted(pids)
    outputs = []
    if runs.is_dir():
        for n in nodes:
            script = root / node_folder(n) / "stop.sh"
            done = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, check=False,
                                  env=_script_env(runs, {STOP_GRACE_ENV:
                                                         str(math.ceil(grace_s))}))
            outputs.append(done.stdout + done.stderr)
    left = []
    for name, pid in pids.items():
        if not _live(pid):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _live(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _live(pid):
            left.append(name)
    deadline = time.monotonic() + PORT_FREE_WAIT_S
    busy = [r.port for r in mine if r.name in running and port_in_use(r.port)]
    while busy and time.monotonic() < deadline:
        time.sleep(0.2)
        busy = [p for p in busy if port_in_use(p)]
    return StopReport(tuple(sorted(running)), tuple(sorted(left)), tuple(busy),
                      "".join(outputs), stale)


@contextlib.contextmanager
def running(folder: str | os.PathLike[str], node: str | None = None,
            timeout_s: float | None = None, *, grace_s: float = STOP_GRACE_S,
            run_dir: str | os.PathLike[str] | None = None) -> Iterator[AppliedRun]:
    """``with running(folder) as run:`` the servers of :func:`apply`, stopped (:func:`stop`) when
    the block ends, however it ends (an exception, Ctrl-C), and when the start fails."""
    try:
        yield apply(folder, node, timeout_s, run_dir=run_dir)
    finally:
        stop(folder, grace_s, node=node, run_dir=run_dir)
