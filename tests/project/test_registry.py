"""One registry shape for every pluggable family (scepsy_common.registry): the shape's own
behaviour, and one conformance check that every family's registry passes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scepsy_common.errors import InputError
from scepsy_common.registry import Registry
from scepsy_opt.planning.optimisers import OPTIMISERS
from scepsy_opt.planning.problem import OBJECTIVES
from scepsy_place.formulations import FORMULATIONS_REGISTRY
from scepsy_place.packing.placement import PLACERS
from scepsy_profile.profiling.registry import BACKENDS
from scepsy_serve.launch.renderers import RENDERERS

FAMILIES: dict[str, Registry] = {"optimisers": OPTIMISERS, "formulations": FORMULATIONS_REGISTRY,
                                 "placers": PLACERS, "renderers": RENDERERS,
                                 "profiler backends": BACKENDS}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_registry_conforms(family: str) -> None:
    reg = FAMILIES[family]
    names = reg.names()
    assert names and len(set(names)) == len(names) == len(reg)
    for name in names:
        entry = reg.entry(name)
        assert entry.name == name and entry.member is reg[name] and name in reg
        assert entry.summary.strip(), f"{family} {name!r} has no summary"
    with pytest.raises(InputError) as err:
        reg.require("no-such-member")
    assert err.value.got == "no-such-member"
    assert err.value.expected == "one of " + ", ".join(sorted(names))
    assert "no-such-member" not in reg


def test_optimisers_and_formulations_declare_their_objectives() -> None:
    for reg in (OPTIMISERS, FORMULATIONS_REGISTRY):
        for name in reg:
            assert reg.entry(name).supports["objective"] == frozenset(OBJECTIVES)


def test_milp_formulations_refuse_other_optimisers() -> None:
    for formulation in FORMULATIONS_REGISTRY:
        for optimiser in OPTIMISERS:
            ok = formulation in ("aggregate", "auto") or optimiser == "milp"
            if ok:
                FORMULATIONS_REGISTRY.check(formulation, "optimiser", optimiser)
            else:
                with pytest.raises(InputError, match="only with optimiser milp"):
                    FORMULATIONS_REGISTRY.check(formulation, "optimiser", optimiser)


def test_only_the_hierarchical_placer_has_an_improvement_phase() -> None:
    assert [p for p in PLACERS if PLACERS.entry(p).allows("option", "repack")] == ["hierarchical"]


@given(st.lists(st.text(min_size=1, max_size=5), unique=True, min_size=1, max_size=6),
       st.dictionaries(st.sampled_from(["a", "b"]), st.frozensets(st.sampled_from("xyz"))))
def test_registry_keeps_names_members_and_support(names: list[str],
                                                  supports: dict[str, frozenset[str]]) -> None:
    reg: Registry[int] = Registry("thing", source="src", field="fld")
    for i, n in enumerate(names):
        assert reg.register(n, i, summary=f"thing {i}", supports=supports) == i
    assert reg.names() == tuple(names) and dict(reg) == {n: i for i, n in enumerate(names)}
    with pytest.raises(ValueError, match="already registered"):
        reg.register(names[0], -1)
    reg.register(names[0], -1, supports=supports, replace=True)
    assert reg[names[0]] == -1
    for aspect in ("a", "b", "c"):
        for value in "xyz":
            allowed = aspect not in supports or value in supports[aspect]
            assert reg.entry(names[-1]).allows(aspect, value) == allowed
            if allowed:
                reg.check(names[-1], aspect, value)
            else:
                with pytest.raises(InputError) as err:
                    reg.check(names[-1], aspect, value)
                assert (err.value.source, err.value.field) == ("src", "fld")


def test_a_member_registered_without_a_summary_gets_one() -> None:
    reg: Registry[object] = Registry("thing", source="s", field="f")

    class Documented:
        """Does a thing well.

        More text."""

    reg.register("doc", Documented)
    reg.register("bare", lambda: None)
    assert reg.entry("doc").summary == "Does a thing well."
    assert reg.entry("bare").summary == "bare"


def test_a_registry_loads_its_builtins_before_any_lookup() -> None:
    calls: list[int] = []
    reg: Registry[str] = Registry("thing", source="s", field="f", load=lambda: (
        calls.append(1), reg.register("late", "x", replace=True)))
    assert "late" in reg and reg.require("late") == "x" and calls
