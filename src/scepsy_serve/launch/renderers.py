"""Renderers: a plan (:class:`~scepsy_serve.launch.launchplan.LaunchPlan`) to the files one launch
target reads (docs/launch.md). One protocol, the registry :data:`RENDERERS`, one conformance
suite (tests/scepsy_serve/test_render_conformance.py) every renderer passes.

A renderer is pure: ``render(plan)`` returns relative POSIX paths and their text, the same
bytes for the same plan on any machine; ``parse(files)`` reads its own output back into the
replicas' :class:`~scepsy_serve.launch.launchplan.Assignment` (round trip). :func:`write_rendered`
writes a render into a folder atomically: the folder holds the old files or all the new ones.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable

from scepsy_common.errors import InputError
from scepsy_common.files import replace_folder
from scepsy_common.registry import Registry
from scepsy_serve.launch.launchplan import Assignment, LaunchPlan

MANIFEST = ".scepsy-launch"
"""The marker file every rendered folder holds (its target): :func:`write_rendered` replaces
only a folder that holds it (or an empty one), never a folder of the user's."""


@runtime_checkable
class Renderer(Protocol):
    # read-only members: the renderers are frozen dataclasses
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def exact(self) -> frozenset[str]:
        """Assignment fields the target expresses exactly: a subset of
        {"node", "gpus", "share", "tp"}; the others parse back as None (or are not compared)."""
        ...

    def render(self, plan: LaunchPlan) -> Mapping[str, str]:
        """Relative POSIX path -> file text. Executable files end in ``.sh``."""
        ...

    def parse(self, files: Mapping[str, str]) -> frozenset[Assignment]:
        """The assignments the rendered ``files`` say (inverse of :meth:`render`)."""
        ...


def register_renderer(renderer: Renderer) -> Renderer:
    """Add ``renderer`` to :data:`RENDERERS` under its name (a name registered again is
    replaced: a test's fake stands in for a built-in)."""
    return RENDERERS.register(renderer.name, renderer, summary=renderer.description,
                              replace=True)


def get_renderer(name: str) -> Renderer:
    return RENDERERS.require(name)


def renderer_names() -> tuple[str, ...]:
    return tuple(sorted(RENDERERS))


BUILTIN = ("k8s", "ray", "routes_target", "shell")
"""Modules of :mod:`scepsy_serve.launch` holding the built-in renderers."""


@functools.cache
def _load_builtin() -> None:
    # the built-in renderers register themselves on import; imported by name (they import this
    # module, so a static import here would be a cycle). A built-in module that is not there
    # (a partial checkout) is skipped; any other import error is raised.
    for module in BUILTIN:
        full = f"{__package__}.{module}"
        try:
            importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise


RENDERERS: Registry[Renderer] = Registry("launch target", source="launch", field="target",
                                         load=_load_builtin)
"""Every renderer by target name (:class:`~scepsy_common.registry.Registry`); the built-in
ones register themselves when their module is imported, on the first lookup."""


def _check_path(rel: str) -> PurePosixPath:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or rel != str(p):
        raise ValueError(f"renderer produced an unsafe path {rel!r}")
    return p


def check_folder(out: str | os.PathLike[str], source: str | None = None,
                 field: str = "--out") -> Path:
    """``out`` as a Path if rendered files may be written there: it does not exist, is an
    empty folder, or holds :data:`MANIFEST`; else an :class:`InputError` (``source``: default
    the path itself). Nothing is written."""
    dest = Path(out)
    where = str(dest) if source is None else source
    got = None if source is None else str(dest)
    if dest.exists():
        if not dest.is_dir():
            raise InputError(where, field, "a folder (or a path that does not exist)", got)
        if any(dest.iterdir()) and not (dest / MANIFEST).is_file():
            raise InputError(where, field, "an empty folder or one written by `scepsy launch` "
                             "(it holds other files, which would be lost)", got)
    return dest


def write_rendered(files: Mapping[str, str], out: str | os.PathLike[str], target: str) -> Path:
    """Write ``files`` into the folder ``out`` atomically (module docstring): into a new folder
    beside it, then renamed over it. An existing ``out`` is replaced only when it is empty or
    was written here (holds :data:`MANIFEST`); otherwise an :class:`InputError`."""
    dest = check_folder(out)

    def fill(tmp: Path) -> None:
        for rel, text in sorted(files.items()):
            p = tmp / _check_path(rel)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text, encoding="utf-8")
            os.chmod(p, 0o755 if rel.endswith(".sh") else 0o644)
        (tmp / MANIFEST).write_text(target + "\n", encoding="utf-8")

    return replace_folder(dest, fill, mode=0o755)


def read_rendered(folder: str | os.PathLike[str]) -> dict[str, str]:
    """The text files of a rendered folder (relative POSIX path -> text), marker excluded;
    runtime files the shell target writes when applied (``run/``) are left out."""
    root = Path(folder)
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != MANIFEST and p.relative_to(root).parts[0] != "run"}
