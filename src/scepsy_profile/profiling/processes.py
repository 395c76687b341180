"""Process groups of engines: an engine (a vLLM worker, ``vllm serve``) is started as the leader
of its own process group (``start_new_session=True``), and ended with its whole group. The
processes of a group, and what they were started with, are read with psutil."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import psutil


def end_process_group(proc: subprocess.Popen[Any], grace_s: float,
                      wait_first: bool = True) -> None:
    """Wait up to ``grace_s`` for ``proc`` (a process-group leader) to exit (when
    ``wait_first``), then SIGTERM its group, then SIGKILL whatever of the group is left after
    another ``grace_s``."""
    pgid = proc.pid
    if wait_first:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_alive(pgid):
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace_s
        while group_alive(pgid) and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace_s)


def group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is alive (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _live_pgid(proc: psutil.Process) -> int | None:
    """The process group of ``proc`` when it is alive and not a zombie, else None."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return os.getpgid(proc.pid)
    except (psutil.Error, ProcessLookupError, PermissionError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``, sorted by pid."""
    return sorted(proc.pid for proc in psutil.process_iter() if _live_pgid(proc) == pgid)


def group_has(pgid: int, test: Callable[[psutil.Process], bool]) -> bool:
    """Whether a live process of group ``pgid`` passes ``test`` (a process that ends or cannot
    be read meanwhile does not)."""
    for pid in group_members(pgid):
        with contextlib.suppress(psutil.Error):
            if test(psutil.Process(pid)):
                return True
    return False


def marked_processes(name: str, value: str) -> tuple[int, ...]:
    """Live (not zombie) processes whose environment holds ``name=value``, sorted by pid
    (processes whose environment cannot be read are left out)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(name) == value:
                found.append(proc.pid)
    return tuple(sorted(found))
