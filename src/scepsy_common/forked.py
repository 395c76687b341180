"""Work in a forked child process that can be waited for with a limit, and killed past it.

:class:`Forked` runs a function in a child made by ``fork`` (it sees the parent's memory as it
was, copy-on-write) and sends its pickled result back through a pipe. The parent goes on with
its own work and later waits for the result with a limit: a child still running then is
killed (``SIGKILL``) and reaped, and the wait raises :class:`ChildKilled`. A child that dies
without a result (an exception, a signal) makes the wait raise ``RuntimeError``; a parent that
leaves the ``with`` block any other way (an exception, Ctrl-C) kills and reaps the child, so
none outlives it.

Two uses: a HiGHS solve whose presolve has no time check (``scepsy_opt.planning.solver``), and
a lower bound computed on a second core while the first searches for plans
(``scepsy_place.formulations.loop``, ``auto``). Only platforms with ``fork`` (:func:`can_fork`)
run children; callers do the work in-process elsewhere.
"""

from __future__ import annotations

import contextlib
import copyreg
import io
import math
import os
import pickle
import select
import signal
import sys
import time
from collections.abc import Callable
from types import MappingProxyType, TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")


def _proxy(items: dict) -> MappingProxyType:
    """A read-only mapping again, as the child's result had it."""
    return MappingProxyType(items)


def dumps(x: object) -> bytes:
    """``x`` pickled as a child sends it: read-only mappings (``MappingProxyType``, which the
    frozen results hold and ``pickle`` refuses) travel as their items and come back read-only."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = {**copyreg.dispatch_table,
                              MappingProxyType: lambda m: (_proxy, (dict(m),))}
    pickler.dump(x)
    return buf.getvalue()


def can_fork() -> bool:
    """Whether this platform can run a :class:`Forked` child."""
    return hasattr(os, "fork")


class ChildKilled(Exception):
    """The child was still running when the wait's limit passed: it was killed, no result."""


class Forked(Generic[T]):
    """``fn()`` running in a forked child (module docstring); use it as a context manager.

    ``wait(seconds)`` returns ``fn``'s result, raises :class:`ChildKilled` when the child is
    still running ``seconds`` from the call (it is killed then) and ``RuntimeError`` when it
    died without one. The result must pickle (read-only mappings may be in it: :func:`dumps`).
    The child leaves with ``os._exit``: the parent's exit handlers, buffers and ``atexit``
    functions never run twice.
    """

    def __init__(self, fn: Callable[[], T]) -> None:
        if not can_fork():
            raise RuntimeError("this platform cannot fork a child process")
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, leave
            code = 1
            try:
                os.close(read)
                payload = dumps(fn())
                with os.fdopen(write, "wb") as out:
                    out.write(payload)
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        self.pid = pid
        self._read = read
        self._chunks: list[bytes] = []
        self._done = False

    @property
    def running(self) -> bool:
        """Whether the child has not been waited for (or killed) yet."""
        return not self._done

    def wait(self, seconds: float) -> T:
        """The child's result, waiting at most ``seconds`` (module docstring)."""
        if self._done:
            raise RuntimeError("the child was already waited for")
        end = time.monotonic() + max(0.0, seconds)
        poller = select.poll()  # not select.select: a server's descriptors may pass FD_SETSIZE
        poller.register(self._read, select.POLLIN | select.POLLHUP)
        while True:
            left = end - time.monotonic()
            if left <= 0 or not poller.poll(max(1, math.ceil(left * 1000))):
                self.kill()
                raise ChildKilled(f"the child {self.pid} was still running after {seconds:g} s")
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                break
            self._chunks.append(chunk)
        _, status = os.waitpid(self.pid, 0)
        self._close()
        if status != 0 or not self._chunks:
            raise RuntimeError(f"a child process ended without an answer (wait status {status})")
        result: T = pickle.loads(b"".join(self._chunks))
        return result

    def kill(self) -> None:
        """Kill and reap the child if it still runs (idempotent)."""
        if self._done:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self._close()

    def _close(self) -> None:
        self._done = True
        os.close(self._read)

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()
