"""One conformance suite that every latency model passes (the ``LatencyModel`` contract).

Every class in the ``scepsy*`` packages that implements the protocol (``prefill_ms``,
``decode_ms``, ``covers``) is discovered by :func:`latency_model_classes`; each must have at
least one example in :data:`EXAMPLES`, so a model added later is either checked here or fails
``test_every_latency_model_has_an_example``. The contract (docs/profiles.md, "The latency-model
contract"):

* one point gives the same answer however it is asked (a Python scalar, a numpy scalar, an element
  of an array, broadcast against other arrays) within a relative ``REL`` (1e-12); a float for
  scalar input, an array of the broadcast shape otherwise;
* answers are finite and positive, never smaller with a larger batch or more tokens, never larger
  with a larger share;
* a pickled model answers exactly as the original (same code, same numbers);
* an instance ``(model, gpu, tp)`` it does not cover raises ``UncoveredInstanceError`` with one
  message shape from every model, and ``covers`` is False exactly there;
* an out-of-range share, batch or token count is an ``InputError`` naming the argument;
* ``measured_shares`` (optional in the protocol, defined by every model here) is a range of
  shares in (0, 1] or None (not a measurement), raises ``UncoveredInstanceError`` where
  ``covers`` is False, and survives pickling.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pickle
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import GPU as SYN_GPU
from conftest import MODEL as SYN_MODEL
from scepsy_common.errors import InputError, UncoveredInstanceError
from scepsy_profile.fitted import FittedLatencyModel
from scepsy_profile.latency import CompositeLatencyModel, LatencyModel, measured_shares
from scepsy_profile.mps import PhaseShareModel
from scepsy_profile.overheads import EngineOverheads, OverheadLatencyModel
from scepsy_profile.roofline import RooflineModel

REL = 1e-12  # the documented scalar/array contract, also the slack of the monotonicity checks
PACKAGES = ("scepsy_profile", "scepsy_opt", "scepsy_place", "scepsy")
PHASES = ("prefill", "decode")
SHAPE = re.compile(r"^[^:]+: \(model, gpu, tp\): expected .+ \(got '(?P<model>[^@']+)@(?P<gpu>[^ ']+) "
                   r"tp=(?P<tp>-?\d+)'\)$", re.S)

Instance = tuple[str, str, int]

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)


@dataclass(frozen=True)
class Example:
    """A built model, instances it covers and instances it does not."""

    model: LatencyModel
    covered: tuple[Instance, ...]
    uncovered: tuple[Instance, ...]


def _roofline(fx: dict) -> Example:
    return Example(fx["roofline"],
                   covered=(("llama-2-7b", "A100-80GB", 1), ("qwen2.5-14b", "H100-80GB", 2),
                            ("llama-2-70b", "L4", 8), ("llama-3-8b", "A100-80GB", 4)),
                   uncovered=(("no-such-llm", "A100-80GB", 1), ("llama-2-7b", "Z9000", 1),
                              ("llama-2-7b", "A100-80GB", 3), ("llama-2-7b", "A100-80GB", 0)))


def _all_covered(model: FittedLatencyModel) -> tuple[Instance, ...]:
    out = []
    for name in model.models():
        for gpu in sorted({k[1] for k in model.curve_keys() if k[0] == name}):
            tps = model.tps(name, gpu)
            out += [(name, gpu, tp) for tp in range(tps[0], tps[-1] + 1) if model.covers(name, gpu, tp)]
    return tuple(out)


def _fitted_synthetic(fx: dict) -> Example:
    model = fx["synthetic_fit"]
    return Example(model, covered=_all_covered(model),  # measured TP 1 and 4; 2 and 3 interpolated
                   uncovered=((SYN_MODEL, SYN_GPU, 8), ("llama-65b", SYN_GPU, 1),
                              (SYN_MODEL, "H100-80GB", 1)))


def _fitted_bundled(fx: dict) -> Example:
    model = fx["bundled_curves"]
    return Example(model, covered=_all_covered(model),
                   uncovered=(("llama-65b", "A100-80GB", 1), ("llama-7b", "A100-80GB", 16),
                              ("llama-2-7b", "A100-80GB", 1), ("llama-7b", "H100-80GB", 1)))


def _composite(fx: dict) -> Example:
    return Example(CompositeLatencyModel(fx["bundled_curves"], fx["roofline"]),
                   covered=(("llama-7b", "A100-80GB", 1),     # measured
                            ("llama-13b", "A100-80GB", 3),    # measured TP 2 and 4, interpolated
                            ("llama-65b", "A100-80GB", 1),    # not measured: roofline
                            ("llama-3-8b", "H100-80GB", 2)),  # roofline
                   uncovered=(("no-such-llm", "A100-80GB", 1), ("llama-7b", "Z9000", 1),
                              ("llama-7b", "A100-80GB", 12)))  # 12 does not divide 32 heads


def _overheads(fx: dict) -> Example:
    inner = _composite(fx)
    o = EngineOverheads("vllm", "0.32.0", "A100-80GB", iteration_ms=0.4, per_token_ms=0.15,
                        first_token_ms=4.0, http_ms=10.0)
    return Example(OverheadLatencyModel(inner.model, o), covered=inner.covered,
                   uncovered=inner.uncovered)


def _phase_shares(fx: dict) -> Example:
    inner = _composite(fx)
    return Example(PhaseShareModel(inner.model, prefill=0.6, decode=0.4, slowdown=1.3),
                   covered=inner.covered, uncovered=inner.uncovered)


# Every latency model class and how to build examples of it (from the session fixtures).
EXAMPLES: dict[type, dict[str, Callable[[dict], Example]]] = {
    RooflineModel: {"roofline": _roofline},
    FittedLatencyModel: {"fitted-synthetic": _fitted_synthetic, "fitted-bundled": _fitted_bundled},
    CompositeLatencyModel: {"composite": _composite},
    OverheadLatencyModel: {"overheads": _overheads},
    PhaseShareModel: {"phase-shares": _phase_shares},
}
NAMES = [name for builders in EXAMPLES.values() for name in builders]


def latency_model_classes() -> set[type]:
    """Every class of the scepsy packages that implements the ``LatencyModel`` protocol."""
    found = set()
    for pkg_name in PACKAGES:
        pkg = importlib.import_module(pkg_name)
        modules = [pkg] + [importlib.import_module(info.name)
                           for info in pkgutil.walk_packages(pkg.__path__, pkg_name + ".")
                           if not info.name.endswith("__main__")]
        for mod in modules:
            for _, cls in inspect.getmembers(mod, inspect.isclass):
                if cls.__module__ != mod.__name__ or getattr(cls, "_is_protocol", False):
                    continue
                if all(callable(getattr(cls, m, None)) for m in ("prefill_ms", "decode_ms", "covers")):
                    found.add(cls)
    return found


@pytest.fixture(scope="session")
def examples(roofline, synthetic_fit, bundled_curves) -> dict[str, Example]:
    fx = {"roofline": roofline, "synthetic_fit": synthetic_fit, "bundled_curves": bundled_curves}
    return {name: build(fx) for builders in EXAMPLES.values() for name, build in builders.items()}


def _ask(model: LatencyModel, phase: str, inst: Instance, share, batch, tokens):
    fn = model.prefill_ms if phase == "prefill" else model.decode_ms
    return fn(*inst, share, batch, tokens)


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b))


shares = st.floats(0.01, 1.0)
batches = st.one_of(st.integers(1, 4096), st.floats(1.0, 4096.0))
tokens = st.one_of(st.integers(1, 65536), st.floats(1.0, 65536.0))
phases = st.sampled_from(PHASES)


# --------------------------------------------------------------------------- completeness


def test_every_latency_model_has_an_example() -> None:
    found = latency_model_classes()
    assert {RooflineModel, FittedLatencyModel, CompositeLatencyModel} <= found  # discovery works
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in found - set(EXAMPLES))
    assert not missing, (f"latency models without a conformance example: {missing}; add one to "
                         "EXAMPLES in tests/scepsy_profile/test_latency_conformance.py")


@pytest.mark.parametrize("name", NAMES)
def test_examples_are_latency_models_with_their_class(examples, name) -> None:
    ex = examples[name]
    cls = next(c for c, builders in EXAMPLES.items() if name in builders)
    assert isinstance(ex.model, cls) and isinstance(ex.model, LatencyModel)
    assert ex.covered and ex.uncovered


# --------------------------------------------------------------------------- scalar vs array


@PROPERTY
@given(phase=phases, data=st.data(),
       points=st.lists(st.tuples(shares, batches, tokens), min_size=1, max_size=12))
@pytest.mark.parametrize("name", NAMES)
def test_scalar_numpy_scalar_and_array_answers_agree(examples, name, phase, data, points) -> None:
    ex = examples[name]
    inst = data.draw(st.sampled_from(ex.covered))
    s, b, n = (np.array(col, dtype=float) for col in zip(*points, strict=True))
    vec = _ask(ex.model, phase, inst, s, b, n)
    assert isinstance(vec, np.ndarray) and vec.shape == s.shape
    for i, (si, bi, ni) in enumerate(points):
        one = _ask(ex.model, phase, inst, si, bi, ni)
        assert type(one) is float
        assert _close(one, float(vec[i])), (inst, si, bi, ni, one, vec[i])
        for asked in ((np.float64(si), np.float64(bi), np.float64(ni)),
                      (np.asarray(si), np.asarray(bi), np.asarray(ni))):
            again = _ask(ex.model, phase, inst, *asked)
            assert type(again) is float and _close(again, one), (asked, again, one)


@PROPERTY
@given(phase=phases, data=st.data(), s=st.lists(shares, min_size=1, max_size=3),
       b=st.lists(batches, min_size=1, max_size=4), n=st.lists(tokens, min_size=1, max_size=3))
@pytest.mark.parametrize("name", NAMES)
def test_broadcasting_gives_the_pointwise_answers(examples, name, phase, data, s, b, n) -> None:
    ex = examples[name]
    inst = data.draw(st.sampled_from(ex.covered))
    grid = _ask(ex.model, phase, inst, np.array(s)[:, None, None], np.array(b, float)[None, :, None],
                np.array(n, float)[None, None, :])
    assert grid.shape == (len(s), len(b), len(n))
    for i, j, k in np.ndindex(grid.shape):
        assert _close(float(grid[i, j, k]), _ask(ex.model, phase, inst, s[i], b[j], n[k]))
    # a scalar against arrays, and plain lists, broadcast the same way
    row = _ask(ex.model, phase, inst, s[0], list(b), n[0])
    assert isinstance(row, np.ndarray) and row.shape == (len(b),)
    for j in range(len(b)):
        assert _close(float(row[j]), float(grid[0, j, 0]))


# --------------------------------------------------------------------------- physics


@PROPERTY
@given(phase=phases, data=st.data(), s=shares, b=batches, n=tokens)
@pytest.mark.parametrize("name", NAMES)
def test_answers_are_finite_and_positive(examples, name, phase, data, s, b, n) -> None:
    ex = examples[name]
    inst = data.draw(st.sampled_from(ex.covered))
    t = _ask(ex.model, phase, inst, s, b, n)
    assert math.isfinite(t) and t > 0


@PROPERTY
@given(phase=phases, data=st.data(), s=shares, b1=batches, b2=batches, n1=tokens, n2=tokens)
@pytest.mark.parametrize("name", NAMES)
def test_more_batch_or_tokens_is_never_faster(examples, name, phase, data, s, b1, b2, n1,
                                              n2) -> None:
    ex = examples[name]
    inst = data.draw(st.sampled_from(ex.covered))
    (b_lo, b_hi), (n_lo, n_hi) = sorted((b1, b2)), sorted((n1, n2))
    base = _ask(ex.model, phase, inst, s, b_lo, n_lo)
    assert _ask(ex.model, phase, inst, s, b_hi, n_lo) >= base * (1 - REL)
    assert _ask(ex.model, phase, inst, s, b_lo, n_hi) >= base * (1 - REL)


@PROPERTY
@given(phase=phases, data=st.data(), s1=shares, s2=shares, b=batches, n=tokens)
@pytest.mark.parametrize("name", NAMES)
def test_less_share_is_never_faster(examples, name, phase, data, s1, s2, b, n) -> None:
    ex = examples[name]
    inst = data.draw(st.sampled_from(ex.covered))
    lo, hi = sorted((s1, s2))
    assert _ask(ex.model, phase, inst, lo, b, n) >= _ask(ex.model, phase, inst, hi, b, n) * (1 - REL)


# --------------------------------------------------------------------------- pickling


@pytest.mark.parametrize("name", NAMES)
def test_pickle_round_trip_answers_identically(examples, name) -> None:
    ex = examples[name]
    back = pickle.loads(pickle.dumps(ex.model))
    assert type(back) is type(ex.model)
    rng = np.random.default_rng(0)
    s, b, n = rng.uniform(0.05, 1, 40), rng.uniform(1, 600, 40), rng.uniform(1, 9000, 40)
    for inst in ex.covered:
        assert back.covers(*inst)
        for phase in PHASES:  # the same code on the same numbers: identical, not just close
            np.testing.assert_array_equal(_ask(back, phase, inst, s, b, n),
                                          _ask(ex.model, phase, inst, s, b, n))
            assert _ask(back, phase, inst, 0.5, 8, 300) == _ask(ex.model, phase, inst, 0.5, 8, 300)
    for inst in ex.uncovered:
        assert not back.covers(*inst)
        with pytest.raises(UncoveredInstanceError):
            back.decode_ms(*inst, 1.0, 1, 128)


# --------------------------------------------------------------------------- coverage and errors


@pytest.mark.parametrize("name", NAMES)
def test_covered_instances_answer(examples, name) -> None:
    ex = examples[name]
    for inst in ex.covered:
        assert ex.model.covers(*inst) is True, inst
        for phase in PHASES:
            assert _ask(ex.model, phase, inst, 1.0, 1, 128) > 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("phase", PHASES)
def test_uncovered_instance_raises_one_error_shape(examples, name, phase) -> None:
    ex = examples[name]
    for model, gpu, tp in ex.uncovered:
        assert ex.model.covers(model, gpu, tp) is False
        for share in (1.0, np.array([0.5, 1.0])):  # the scalar and the array path
            with pytest.raises(UncoveredInstanceError) as info:
                _ask(ex.model, phase, (model, gpu, tp), share, 1, 128)
            err = info.value
            assert isinstance(err, InputError) and isinstance(err, KeyError)
            assert (err.model, err.gpu, err.tp) == (model, gpu, tp)
            assert err.field == "(model, gpu, tp)"
            match = SHAPE.match(str(err))
            assert match, str(err)
            assert match.group("model", "gpu", "tp") == (model, gpu, str(tp))
            assert str(pickle.loads(pickle.dumps(err))) == str(err)  # crosses process boundaries


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("share", "batch", "tok", "field"), [
    (0.0, 1, 1, "share"), (1.5, 1, 1, "share"), (float("nan"), 1, 1, "share"),
    (np.array([0.5, -1.0]), 1, 1, "share"), (0.5, 0, 1, "batch"), (0.5, np.array([1, 0]), 1, "batch"),
    (0.5, 1, 0, "tokens"), (0.5, 1, float("nan"), "tokens"),
])
@pytest.mark.parametrize("phase", PHASES)
def test_out_of_range_queries_name_the_argument(examples, name, share, batch, tok, field,
                                                phase) -> None:
    ex = examples[name]
    with pytest.raises(InputError) as info:
        _ask(ex.model, phase, ex.covered[0], share, batch, tok)
    want = {"share": "share", "batch": "batch", "tokens": "seq" if phase == "prefill" else "ctx"}
    assert info.value.field == want[field]
    assert not isinstance(info.value, UncoveredInstanceError)


# --------------------------------------------------------------------------- measured shares


def test_every_latency_model_defines_measured_shares() -> None:
    """The method is optional for models from elsewhere (:func:`measured_shares` reads a model
    without it as None), but every model of these packages decides: a wrapper that forgot to
    pass it on would hide its inner model's range."""
    missing = sorted(f"{c.__module__}.{c.__qualname__}" for c in latency_model_classes()
                     if not callable(getattr(c, "measured_shares", None)))
    assert not missing, f"latency models without measured_shares: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_measured_shares_is_a_share_range_or_none(examples, name) -> None:
    ex = examples[name]
    for inst in ex.covered:
        got = measured_shares(ex.model, *inst)
        assert got == ex.model.measured_shares(*inst)
        if got is None:
            continue
        lo, hi = got
        assert type(lo) is float and type(hi) is float, got
        assert 0 < lo <= hi <= 1, (inst, got)
    back = pickle.loads(pickle.dumps(ex.model))
    assert [measured_shares(back, *i) for i in ex.covered] == \
        [measured_shares(ex.model, *i) for i in ex.covered]


@pytest.mark.parametrize("name", NAMES)
def test_measured_shares_of_an_uncovered_instance_raises(examples, name) -> None:
    ex = examples[name]
    for model, gpu, tp in ex.uncovered:
        with pytest.raises(UncoveredInstanceError) as info:
            measured_shares(ex.model, model, gpu, tp)
        assert (info.value.model, info.value.gpu, info.value.tp) == (model, gpu, tp)
        assert SHAPE.match(str(info.value)), str(info.value)


@pytest.mark.parametrize("name", ["fitted-synthetic", "fitted-bundled"])
def test_fitted_measured_shares_span_the_share_nodes(examples, name) -> None:
    """At a measured TP degree the range is the share nodes' span of both phases' curves (the
    nodes span exactly the measured shares); between two, within both degrees' ranges."""
    model = examples[name].model
    for inst in examples[name].covered:
        lo, hi = measured_shares(model, *inst)
        m, gpu, tp = inst
        used = [t for t in model.tps(m, gpu) if t == tp] or [
            max(t for t in model.tps(m, gpu) if t < tp), min(t for t in model.tps(m, gpu) if t > tp)]
        nodes = [model.curves[(m, gpu, t, ph)].share_nodes for t in used for ph in PHASES]
        assert lo == max(float(n[0]) for n in nodes) and hi == min(float(n[-1]) for n in nodes)


def test_measured_shares_of_the_bundled_curves_and_the_roofline(examples) -> None:
    """MuxServe measured 30% to 100% of the SMs; the roofline is a model (None), and the
    composite and the overheads wrapper answer as the model that serves the instance."""
    assert measured_shares(examples["fitted-bundled"].model, "llama-7b", "A100-80GB", 1) == (0.3, 1.0)
    assert measured_shares(examples["roofline"].model, "llama-2-7b", "A100-80GB", 1) is None
    for name in ("composite", "overheads"):
        model = examples[name].model
        assert measured_shares(model, "llama-7b", "A100-80GB", 1) == (0.3, 1.0)  # measured
        assert measured_shares(model, "llama-65b", "A100-80GB", 1) is None       # roofline
        assert measured_shares(model, "llama-3-8b", "H100-80GB", 2) is None


def test_a_model_without_the_method_counts_as_covering_every_share(examples) -> None:
    class Bare:  # a LatencyModel written before measured_shares
        def prefill_ms(self, model, gpu, tp, share, batch, seq):
            return 1.0

        def decode_ms(self, model, gpu, tp, share, batch, ctx):
            return 1.0

        def covers(self, model, gpu, tp):
            return True

    assert isinstance(Bare(), LatencyModel)
    assert measured_shares(Bare(), "llama-7b", "A100-80GB", 1) is None
    composite = CompositeLatencyModel(Bare(), examples["roofline"].model)
    assert measured_shares(composite, "llama-7b", "A100-80GB", 1) is None
