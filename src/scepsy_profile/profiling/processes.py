"""Process groups of engines: an engine (a vLLM worker, ``vllm serve``) is started as the leader
of its own process group (``start_new_session=True``), and ended with its whole group."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


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


def group_members(pgid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Live (not zombie) processes of group ``pgid``, from ``/proc`` (Linux)."""
    out = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry.name))
    return out
