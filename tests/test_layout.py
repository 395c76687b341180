"""scepsy_opt's layout: the data model at the top, three sub-packages by concern (``ingest``,
``prediction``, ``planning``) beside ``validate``, and every moved module's old flat path still
importable as the very same module (the public API stays stable; the code is not copied)."""

from __future__ import annotations

import ast
import importlib

import pytest

from test_structure import SRC, Import, alias_target, aliases, cycles, import_graph

# the sub-packages and what moved into them, from the flat scepsy_opt
LAYOUT = {
    "ingest": ("mooncake", "otel", "otlp_http", "record", "tracemap"),
    "prediction": ("colocation", "pipeline", "reports", "simulate", "slo", "tails"),
    "planning": ("baselines", "candidates", "coverage", "instances", "milp", "mincost", "mixing",
                 "optimisers", "planfile", "plans", "problem", "solver"),
}
MOVED = {f"scepsy_opt.{m}": f"scepsy_opt.{pkg}.{m}" for pkg, ms in LAYOUT.items() for m in ms}
# modules written inside a sub-package (no old flat path)
BORN = {"prediction": ("priority", "schedule")}
# the data model every stage shares, at the top
TOP = ("allocation", "arrivals", "cluster", "ratework", "stats", "traces", "workflows",
       "workload")


def test_the_aliases_are_the_moved_modules() -> None:
    """Every old path is an alias of its module, and nothing else is."""
    assert aliases(SRC) == MOVED


def test_the_top_holds_the_data_model_and_the_aliases() -> None:
    top = {p.stem for p in (SRC / "scepsy_opt").glob("*.py")} - {"__init__"}
    assert top == set(TOP) | {old.rpartition(".")[2] for old in MOVED}
    packages = {p.parent.name for p in (SRC / "scepsy_opt").glob("*/__init__.py")}
    assert packages == {*LAYOUT, "validate"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_moved_module(old: str) -> None:
    """``import scepsy_opt.milp`` gives ``scepsy_opt.planning.milp`` itself: one module object,
    so its classes, registries and monkeypatches are the same whichever path a user imports."""
    new = MOVED[old]
    path = SRC.joinpath(*old.split(".")).with_suffix(".py")
    assert alias_target(path) == new
    assert SRC.joinpath(*new.split(".")).with_suffix(".py").is_file()
    module = importlib.import_module(new)
    assert importlib.import_module(old) is module
    assert module.__name__ == new
    assert getattr(importlib.import_module("scepsy_opt"), old.rpartition(".")[2]) is module
    assert f":mod:`{new}`" in (ast.get_docstring(ast.parse(path.read_text())) or "")


@pytest.mark.parametrize("pkg", sorted(LAYOUT))
def test_a_sub_package_says_what_is_inside(pkg: str) -> None:
    """Each sub-package's docstring names each of its modules (and no other)."""
    init = SRC / "scepsy_opt" / pkg / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    here = {p.stem for p in init.parent.glob("*.py")} - {"__init__"}
    assert here == set(LAYOUT[pkg]) | set(BORN.get(pkg, ()))
    named = {line.split("`")[1].rpartition(".")[2] for line in doc.splitlines()
             if line.startswith("* :mod:`")}
    assert named == here


def test_the_sub_packages_point_one_way() -> None:
    """Collapsed to scepsy_opt's sub-packages (the top-level data model as one), the import
    graph has no cycle: ingest and prediction build on the model, planning on prediction."""
    alias = aliases(SRC)

    def part(module: str) -> str:
        sub = module.split(".")[1]
        return sub if sub in {*LAYOUT, "validate"} else "model"

    edges = [Import(part(e.source), part(e.target), e.line, e.nested, e.type_only)
             for e in import_graph(SRC)
             if e.source.startswith("scepsy_opt.") and e.target.startswith("scepsy_opt.")
             and e.source not in alias and part(e.source) != part(e.target)]
    assert cycles(edges) == []
    assert {(e.source, e.target) for e in edges if not e.type_only} <= {
        ("ingest", "model"), ("prediction", "model"), ("planning", "model"),
        ("planning", "prediction"), ("validate", "model"), ("validate", "prediction")}


# scepsy_place: packing and formulations beside control, launch and report; the old flat paths are
# registered by the package as the very modules they moved to (no alias files: two of the
# names, quality and improve, are also functions the package exports)
PLACE = {
    "packing": ("bounds", "check", "exact", "exhaustive", "fgd", "groups", "improve", "openb",
                "placement", "quality", "replicas", "topology"),
    "formulations": ("blocks", "cuts", "incremental", "loop", "patterns", "placed", "slots"),
}


def test_scepsy_place_is_laid_out_by_concern() -> None:
    import scepsy_place

    assert {m: p for p, ms in PLACE.items() for m in ms} == scepsy_place.MOVED
    top = {p.stem for p in (SRC / "scepsy_place").glob("*.py")} - {"__init__"}
    assert top == {"request"}
    packages = {p.parent.name for p in (SRC / "scepsy_place").glob("*/__init__.py")}
    assert packages == {*PLACE, "control", "launch", "report"}
    for pkg, modules in PLACE.items():
        here = {p.stem for p in (SRC / "scepsy_place" / pkg).glob("*.py")} - {"__init__"}
        assert here == set(modules)


@pytest.mark.parametrize("old", sorted(m for ms in PLACE.values() for m in ms))
def test_an_old_scepsy_place_path_is_the_moved_module(old: str) -> None:
    import scepsy_place

    new = f"scepsy_place.{scepsy_place.MOVED[old]}.{old}"
    assert importlib.import_module(f"scepsy_place.{old}") is importlib.import_module(new)
    # the package's exported functions keep their names (quality, improve)
    assert callable(scepsy_place.quality) and callable(scepsy_place.improve)


def test_packing_never_imports_the_formulations() -> None:
    edges = [e for e in import_graph(SRC) if e.source.startswith("scepsy_place.packing.")
             and e.target.startswith("scepsy_place.formulations")]
    assert edges == []
