"""docs/index.md links every page; docs/api.md names every public name of every package.

The API reference (docs/api.md) is generated from the code: ``python tests/project/test_docs_index.py``
rewrites it from each package's ``__all__`` (or, for a package without one, the public classes and
functions of its modules) and the first sentence of each docstring. The tests below fail when a
public name is missing from it or a page is missing from the index.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
INDEX = DOCS / "index.md"
API = DOCS / "api.md"
PACKAGES = ("scepsy", "scepsy_profile", "scepsy_opt", "scepsy_place", "scepsy_serve")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _packages() -> list[str]:
    """The five named packages plus any other package under src/ (shared plumbing included)."""
    found = sorted(p.parent.name for p in (REPO / "src").glob("*/__init__.py"))
    return [*PACKAGES, *(n for n in found if n not in PACKAGES)]


def _modules(pkg: ModuleType) -> list[ModuleType]:
    """Every public module of the package, sub-packages' modules included (a name with a
    leading ``_`` anywhere in its dotted path is private)."""
    found = [(m.name, importlib.import_module(m.name))
             for m in pkgutil.walk_packages(pkg.__path__, prefix=f"{pkg.__name__}.")
             if not any(part.startswith("_") for part in m.name.split("."))]
    return [mod for name, mod in found if mod.__name__ == name]


def _defined_public(mod: ModuleType) -> list[str]:
    if hasattr(mod, "__all__"):
        return list(mod.__all__)
    return sorted(n for n, o in vars(mod).items()
                  if not n.startswith("_") and (inspect.isclass(o) or inspect.isfunction(o))
                  and getattr(o, "__module__", None) == mod.__name__)


def public_names(package: str) -> dict[str, list[str]]:
    """``{module: names}``: the package's ``__all__`` under the package's own name, or, when it
    has none, each submodule's ``__all__`` or public classes and functions; the modules of its
    sub-packages (``scepsy_serve.launch``) are listed in either case."""
    pkg = importlib.import_module(package)
    out: dict[str, list[str]] = {}
    mods = _modules(pkg)
    if hasattr(pkg, "__all__"):  # the package's own list; its sub-packages' modules beside it
        out[package] = list(pkg.__all__)
        mods = [m for m in mods if m.__name__.count(".") > 1]
    out.update({m.__name__: names for m in mods if (names := _defined_public(m))})
    return out


def _first_sentence(doc: str | None) -> str:
    """The docstring's first sentence (a full stop outside brackets), reST roles made plain."""
    para = " ".join((doc or "").strip().split("\n\n")[0].split())
    para = re.sub(r":\w+:`~?([^`]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", para)
    para = para.replace("``", "`")
    depth, end = 0, len(para)
    for i, ch in enumerate(para):
        depth += (ch in "([{") - (ch in ")]}")
        if ch == "." and depth == 0 and (i + 1 == len(para) or para[i + 1] == " "):
            end = i + 1
            break
    text = para[:end].strip()
    return text if not text or text.endswith((".", "?")) else text + "."


def describe(obj: object) -> tuple[str, str]:
    """``(kind, one line)`` for a public object."""
    if inspect.isclass(obj):
        own = obj.__dict__.get("__doc__")
        generated = own is not None and re.match(rf"{obj.__name__}\(", own)  # dataclass default
        return "class", "" if generated else _first_sentence(own)
    if inspect.isfunction(inspect.unwrap(obj)) or inspect.isbuiltin(obj):  # type: ignore[arg-type]
        return "function", _first_sentence(obj.__doc__)
    if isinstance(obj, ModuleType):
        return "module", _first_sentence(obj.__doc__)
    if isinstance(obj, dict):
        keys = ", ".join(f"`{k}`" for k in obj)
        return "registry", f"by name: {keys}."
    if isinstance(obj, tuple | list | frozenset | set):
        return "constant", "`" + ", ".join(map(str, obj)) + "`."
    return "constant", f"a `{type(obj).__name__}`."


def render_reference() -> str:
    out = ["# API reference", "",
           "Every public name of scepsy's packages, with the first sentence of its docstring "
           "(`help(name)` in Python gives the rest). Generated from the code by "
           "`python tests/project/test_docs_index.py`; the packages' `__all__` lists decide what is "
           "public. Start from [the index](index.md) for what each stage does.", ""]
    for package in _packages():
        pkg = importlib.import_module(package)
        out += [f"## `{package}`", "", _first_sentence(pkg.__doc__), ""]
        for module, names in public_names(package).items():
            mod = importlib.import_module(module)
            if module != package:
                out += [f"### `{module}`", "", _first_sentence(mod.__doc__), ""]
            for name in names:
                obj = getattr(mod, name)
                kind, line = describe(obj)
                where = getattr(obj, "__module__", None)
                home = f", `{where}`" if module == package and isinstance(where, str) \
                    and where != package else ""
                out.append(f"- `{name}` ({kind}{home}){': ' + line if line else ''}")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_in_the_reference(package):
    text = API.read_text()
    missing = [f"{module}.{name}" for module, names in public_names(package).items()
               for name in names if f"`{name}`" not in text]
    assert not missing, (f"docs/api.md lacks {missing}; regenerate it with "
                         "`python tests/project/test_docs_index.py`")


def test_reference_lists_every_package():
    text = API.read_text()
    assert [p for p in _packages() if f"## `{p}`" not in text] == []


def _links(path: Path) -> set[str]:
    return {t for t in LINK.findall(path.read_text()) if "://" not in t}


def test_index_links_every_doc_page():
    linked = {(INDEX.parent / t).resolve() for t in _links(INDEX)}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p != INDEX}
    assert sorted(p.name for p in pages - linked) == []


def test_index_links_resolve():
    for path in [INDEX, API, REPO / "README.md"]:
        broken = [t for t in _links(path) if not (path.parent / t).exists()]
        assert broken == [], f"{path.name}: {broken}"


def test_readme_links_the_index():
    assert "docs/index.md" in _links(REPO / "README.md")


HISTORY = re.compile(r"\(issue \d+\)|\bissue \d+\b|\bbefore the fix\b|\bearlier measurement\b|"
                     r"\bfirst measurement\b|\bre-measured after\b|\bwhen this was written\b|"
                     r"\bthe previous default\b|\bwas tried\b", re.I)


@pytest.mark.parametrize("path", sorted([REPO / "README.md", *DOCS.glob("*.md")]),
                         ids=lambda p: p.name)
def test_docs_speak_to_users_not_history(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().splitlines(), 1)
            if HISTORY.search(line)]
    assert hits == []


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    API.write_text(render_reference())
    print(f"wrote {API.relative_to(REPO)}")
