"""The module import graph of src/ (read with ast, nothing imported): no import cycles, layers
that point one way (``scepsy_common`` ← ``scepsy_profile`` ← ``scepsy_opt`` ← ``scepsy_place``
← ``scepsy``), and no import of a project module hidden inside a function, where it could hide a
cycle, except in the command line (``src/scepsy/``), which imports what a command needs only
when it runs (start-up time). A module moved to a sub-package leaves an alias at its old path
(``scepsy_opt.milp`` is ``scepsy_opt.planning.milp``) for users; nothing of the project's own
(src/, tests/, benchmarks/, solvers/) imports through one."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = ("scepsy_common", "scepsy_profile", "scepsy_opt", "scepsy_place", "scepsy")
# packages whose function-level imports of project modules are allowed (lazy on purpose)
LAZY_OK = ("scepsy",)


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported project module
    line: int
    nested: bool  # inside a function or class body
    type_only: bool  # under ``if TYPE_CHECKING:``


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path) -> dict[str, Path]:
    return {module_name(root, p): p for p in sorted(root.rglob("*.py"))
            if p.relative_to(root).parts[0] in LAYERS}


def _resolve(name: str, modules: set[str]) -> str | None:
    """The longest prefix of the dotted ``name`` that is a project module."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in modules:
            return cand
    return None


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(name: str, path: Path, modules: set[str]) -> list[Import]:
    """Every import of a project module in one file, with where it sits."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[Import] = []

    def visit(node: ast.AST, nested: bool, type_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for a in child.names:
                    t = _resolve(a.name, modules)
                    if t is not None:
                        out.append(Import(name, t, child.lineno, nested, type_only))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in child.names:  # ``from pkg import submodule`` imports the submodule
                    t = _resolve(f"{base}.{a.name}", modules) or _resolve(base, modules)
                    if t is not None:
                        out.append(Import(name, t, child.lineno, nested, type_only))
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute | ast.Name) \
                    and getattr(child.func, "attr", getattr(child.func, "id", "")) in (
                        "import_module", "__import__") and child.args \
                    and isinstance(child.args[0], ast.Constant) \
                    and isinstance(child.args[0].value, str):
                t = _resolve(child.args[0].value, modules)
                if t is not None:  # a dynamic import is a hidden one wherever it sits
                    out.append(Import(name, t, child.lineno, True, type_only))
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                visit(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                visit(child, nested, True)
            else:
                visit(child, nested, type_only)

    visit(tree, False, False)
    return out


def import_graph(root: Path) -> list[Import]:
    mods = project_modules(root)
    return [i for name, path in mods.items() for i in imports_of(name, path, set(mods))
            if i.target != i.source]


def layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if not e.type_only:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(out)


def layer_violations(edges: list[Import]) -> list[str]:
    return sorted(f"{e.source}:{e.line} imports {e.target}" for e in edges
                  if layer(e.target) > layer(e.source))


def hidden_imports(edges: list[Import]) -> list[str]:
    return sorted(f"{e.source}:{e.line} imports {e.target} inside a function" for e in edges
                  if e.nested and not e.type_only and e.source.split(".")[0] not in LAZY_OK)


def alias_target(path: Path) -> str | None:
    """The module that the module at ``path`` stands for when it is an alias (a moved module's
    old path, kept importable: a docstring, ``import sys``, ``from PKG import MOD as _moved``
    and ``sys.modules[__name__] = _moved``, nothing else), else None."""
    target, replaced = None, False
    for s in ast.parse(path.read_text(), str(path)).body:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
            continue
        if isinstance(s, ast.Import) and [a.name for a in s.names] == ["sys"]:
            continue
        if isinstance(s, ast.ImportFrom) and s.level == 0 and len(s.names) == 1 \
                and s.names[0].asname == "_moved" and target is None:
            target = f"{s.module}.{s.names[0].name}"
        elif isinstance(s, ast.Assign) and ast.unparse(s) == "sys.modules[__name__] = _moved":
            replaced = True
        else:
            return None
    return target if replaced else None


def aliases(root: Path) -> dict[str, str]:
    """``{old path: module}`` for every alias module under ``root``."""
    return {name: t for name, path in project_modules(root).items()
            if (t := alias_target(path)) is not None}


def alias_imports(edges: list[Import], alias: dict[str, str]) -> list[str]:
    """Imports through an alias by anything but another alias."""
    return sorted(f"{e.source}:{e.line} imports {e.target} (an alias: import {alias[e.target]})"
                  for e in edges if e.target in alias and e.source not in alias)


def outside_imports(root: Path, folders: tuple[Path, ...]) -> list[Import]:
    """Imports of project modules (under ``root``) by the Python files in ``folders``."""
    mods = set(project_modules(root))
    return [i for folder in folders for p in sorted(folder.rglob("*.py"))
            for i in imports_of(".".join(p.relative_to(folder.parent).with_suffix("").parts),
                                p, mods)]


# ------------------------------------------------------------------------------- src/

EDGES = import_graph(SRC)


def test_the_graph_is_read() -> None:
    """The checker sees the real graph (not an empty one)."""
    mods = project_modules(SRC)
    assert {"scepsy_opt.planning.milp", "scepsy_place.formulations.loop", "scepsy_common.errors", "scepsy.cli"} <= set(mods)
    assert any(e.source == "scepsy_place.formulations.loop" and e.target == "scepsy_opt.planning.milp" for e in EDGES)
    assert len(EDGES) > 100


def test_no_import_cycles() -> None:
    assert cycles(EDGES) == []


def test_layers_point_one_way() -> None:
    assert layer_violations(EDGES) == []


def test_no_project_import_hidden_in_a_function() -> None:
    assert hidden_imports(EDGES) == []


def test_every_package_is_discovered_by_setuptools() -> None:
    """pyproject's package discovery is ``find`` under src/: every layer is a package there,
    and so is every folder of Python files under a layer (``scepsy_opt.planning``), which
    ``find`` only discovers with its ``__init__.py``."""
    for pkg in LAYERS:
        assert (SRC / pkg / "__init__.py").is_file(), pkg
    folders = {p.parent for pkg in LAYERS for p in (SRC / pkg).rglob("*.py")}
    assert sorted(str(d.relative_to(SRC)) for d in folders
                  if not (d / "__init__.py").is_file()) == []
    setuptools = pytest.importorskip("setuptools")
    assert set(setuptools.find_packages(where=str(SRC))) >= {
        ".".join(d.relative_to(SRC).parts) for d in folders}


def test_nothing_imports_through_an_alias() -> None:
    """The old path of a moved module is for users: src/ (but the aliases themselves), tests/,
    benchmarks/ and solvers/ import the module where it is."""
    alias = aliases(SRC)
    assert len(alias) > 10  # the checker sees the aliases
    repo = SRC.parent
    edges = EDGES + outside_imports(SRC, tuple(repo / d for d in ("tests", "benchmarks",
                                                                  "solvers")))
    assert alias_imports(edges, alias) == []


# ------------------------------------------------------------------------------- the checker

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for pkg in LAYERS:
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    return tmp_path


@pytest.mark.parametrize("files, found", [
    # a cycle hidden by a function-level import (the kind this test exists for)
    ({"scepsy_opt/a.py": "from scepsy_opt.b import x\n",
      "scepsy_opt/b.py": "x = 1\ndef f():\n    from scepsy_opt.a import y\n"},
     {"cycles": [["scepsy_opt.a", "scepsy_opt.b"]],
      "hidden": ["scepsy_opt.b:3 imports scepsy_opt.a inside a function"]}),
    # a lower layer importing a higher one, relative imports, a dynamic import
    ({"scepsy_profile/a.py": "from scepsy_opt import c\n",
      "scepsy_opt/c.py": "from . import d\nimport importlib\n"
                         "m = importlib.import_module('scepsy_place.e')\n",
      "scepsy_opt/d.py": "", "scepsy_place/e.py": ""},
     {"layers": ["scepsy_opt.c:3 imports scepsy_place.e", "scepsy_profile.a:1 imports scepsy_opt.c"],
      "hidden": ["scepsy_opt.c:3 imports scepsy_place.e inside a function"]}),
    # allowed: lazy imports in the CLI, TYPE_CHECKING imports, stdlib imports
    ({"scepsy/cli.py": "def main():\n    from scepsy_place.e import x\n",
      "scepsy_place/e.py": "from typing import TYPE_CHECKING\nimport math\n"
                           "if TYPE_CHECKING:\n    from scepsy.cli import main\nx = 1\n"},
     {}),
])
def test_the_checker_finds_what_it_should(tmp_path: Path, files: dict[str, str],
                                          found: dict[str, list]) -> None:
    edges = import_graph(_tree(tmp_path, files))
    assert cycles(edges) == found.get("cycles", [])
    assert layer_violations([e for e in edges if not e.type_only]) == found.get("layers", [])
    assert hidden_imports(edges) == found.get("hidden", [])


def test_the_checker_finds_imports_through_an_alias(tmp_path: Path) -> None:
    """An alias module is known by its shape; importing it is flagged, but not from another
    alias; a module that does more than stand for another is no alias."""
    alias = ("import sys\n\nfrom scepsy_opt.{pkg} import {m} as _moved\n\n"
             "sys.modules[__name__] = _moved\n")
    root = _tree(tmp_path, {
        "scepsy_opt/sub/__init__.py": "", "scepsy_opt/sub/a.py": "x = 1\n",
        "scepsy_opt/sub/b.py": "",
        "scepsy_opt/a.py": '"""Moved."""\n' + alias.format(pkg="sub", m="a"),
        "scepsy_opt/b.py": alias.format(pkg="sub", m="b") + "y = 2\n",  # more than an alias
        "scepsy_opt/again.py": alias.format(pkg="", m="a").replace("scepsy_opt. ", "scepsy_opt "),
        "scepsy_opt/old.py": "from scepsy_opt import a\n",
        "scepsy_opt/new.py": "from scepsy_opt.sub.a import x\n"})
    found = aliases(root)
    assert found == {"scepsy_opt.a": "scepsy_opt.sub.a", "scepsy_opt.again": "scepsy_opt.a"}
    assert alias_imports(import_graph(root), found) == [
        "scepsy_opt.old:1 imports scepsy_opt.a (an alias: import scepsy_opt.sub.a)"]


# ------------------------------------------------------------------------------- candidate rows

@pytest.mark.parametrize("seed, blocks, current", [(0, False, False), (3, False, True),
                                                   (5, True, False), (8, True, True)])
def test_every_scanned_candidate_is_priced_like_price(seed: int, blocks: bool, current: bool) -> None:
    """The per-shape scan (named rows, batched over shares and replica counts) prices every
    candidate as :func:`price` prices that candidate's instance alone (one code path per
    candidate, no batching), within 1e-9 relative; with a current allocation, the change
    penalty too. Unpruned, so every scanned row is checked."""
    from dataclasses import replace

    from scepsy_opt.allocation import Allocation
    from scepsy_opt.planning.candidates import generate_candidates, price
    from scepsy_opt.planning.instances import random_problem
    from scepsy_profile import roofline_model

    p = random_problem(3, 4, roofline_model(), seed=seed, workflows=2, gpus_per_node=4)
    if current:
        first = {m: c[0] for m, c in generate_candidates(p).by_llm.items() if c}
        if len(first) == len(p.llms):
            p = replace(p, options=replace(p.options, change_penalty_s=0.25, current=Allocation(
                {m: c.instance for m, c in first.items()})))
    cset = generate_candidates(p, prune=False, blocks=blocks)
    any_ = {m: c[0] for m, c in cset.by_llm.items() if c}
    assert len(any_) == len(p.llms) and cset.generated == cset.kept > len(p.llms)
    checked = 0
    for m, cands in cset.by_llm.items():
        for c in cands[:: max(1, len(cands) // 25)]:
            alone = price(p, Allocation({**{k: v.instance for k, v in any_.items()},
                                         m: c.instance}))[m]
            assert (alone.gpu, alone.tp, alone.share, alone.replicas) == (c.gpu, c.tp, c.share,
                                                                          c.replicas)
            if not blocks:  # blocks count whole GPUs: units of full blocks, not of the shares
                assert alone.units == c.units
            assert alone.mu == pytest.approx(c.mu, rel=1e-12)
            for a, b in ((alone.call_latency_s, c.call_latency_s), (alone.latency_s, c.latency_s),
                         (alone.change_s, c.change_s)):
                assert a == pytest.approx(b, rel=1e-9, abs=1e-12)
            assert dict(alone.workflow_latency_s) == pytest.approx(dict(c.workflow_latency_s),
                                                                   rel=1e-9)
            checked += 1
    assert checked > 10
