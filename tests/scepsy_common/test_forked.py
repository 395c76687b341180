"""Forked: a function in a child process, waited for with a limit and killed past it."""

from __future__ import annotations

import os
import pickle
import time
from types import MappingProxyType

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scepsy_common.forked import ChildKilled, Forked, can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="the platform cannot fork")


def _gone(pid: int) -> bool:
    """Whether ``pid`` is neither this process's child nor a zombie waiting to be reaped."""
    if pid in {p.pid for p in psutil.Process(os.getpid()).children()}:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(xs=st.lists(st.integers(-10**9, 10**9), max_size=2000))
def test_the_result_comes_back_as_the_function_computed_it(xs):
    """The child's result is the parent's computation, whatever its size (up to a pipe's
    buffer and past it)."""
    with Forked(lambda: (sorted(xs), sum(xs), str(xs))) as child:
        got = child.wait(30.0)
    assert got == (sorted(xs), sum(xs), str(xs))
    assert _gone(child.pid)


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(tree=st.recursive(st.integers(),
                         lambda inner: st.dictionaries(st.text(max_size=3), inner, max_size=4),
                         max_leaves=20))
def test_read_only_mappings_come_back_read_only(tree):
    """Frozen results hold ``MappingProxyType`` (which ``pickle`` alone refuses): they come back
    equal and read-only, at any depth."""
    def frozen(x):
        return MappingProxyType({k: frozen(v) for k, v in x.items()}) if isinstance(x, dict) \
            else x

    def kinds(x):
        return (type(x).__name__, {k: kinds(v) for k, v in x.items()}) \
            if isinstance(x, MappingProxyType | dict) else type(x).__name__

    want = frozen(tree)
    with pytest.raises(TypeError):
        pickle.dumps(MappingProxyType({}))  # what the child's pickler has to get around
    with Forked(lambda: want) as child:
        got = child.wait(30.0)
    assert got == want and kinds(got) == kinds(want)


def test_a_child_still_running_at_the_limit_is_killed_and_reaped():
    t0 = time.monotonic()
    with Forked(lambda: time.sleep(60)) as child:
        with pytest.raises(ChildKilled):
            child.wait(0.3)
        assert not child.running
    assert time.monotonic() - t0 < 10
    assert _gone(child.pid)


def test_the_parent_works_while_the_child_does():
    """The child runs while the parent goes on: a child that sleeps 2 s and a parent that
    sleeps 2 s take about 2 s together, not 4 s (1.5 s of margin for the fork)."""
    t0 = time.monotonic()
    with Forked(lambda: time.sleep(2.0) or "done") as child:
        time.sleep(2.0)
        assert child.wait(10.0) == "done"
    assert time.monotonic() - t0 < 3.5


def test_a_child_that_raises_is_an_error_not_a_result():
    def boom() -> int:
        raise ValueError("no")

    with Forked(boom) as child, pytest.raises(RuntimeError, match="without an answer"):
        child.wait(30.0)
    assert _gone(child.pid)


def test_leaving_the_block_on_an_exception_kills_the_child():
    with pytest.raises(KeyError), Forked(lambda: time.sleep(60)) as child:
        raise KeyError("the parent failed")
    assert _gone(child.pid)


def test_a_child_is_waited_for_once():
    with Forked(lambda: 1) as child:
        assert child.wait(30.0) == 1
        with pytest.raises(RuntimeError, match="already"):
            child.wait(1.0)
