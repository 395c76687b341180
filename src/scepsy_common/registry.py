"""One registry shape for every pluggable family: optimisers, formulations, placers, launch
renderers, profiler backends.

A :class:`Registry` maps a name to a member (an object, or a factory that builds one) and
records, per name, a one-line summary and what the member supports: for each aspect of a
request (``"objective"``, ``"optimiser"``, ...) the values it works with; an aspect it does not
list, it supports whatever the value. Looking a name up with :meth:`Registry.require` raises an
:class:`~scepsy_common.errors.InputError` that names the family's source and field and lists the
choices; :meth:`Registry.check` refuses a combination the member does not support, naming the
aspect and the values that work. A registry reads like a read-only mapping (``REG[name]``,
``list(REG)``, ``name in REG``) so code that used plain dictionaries keeps working; members
are added with :meth:`Registry.register` (a name registers once unless ``replace``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Generic, TypeVar

from scepsy_common.errors import InputError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered member: its name, the member, a one-line summary and what it supports
    (aspect -> the values it works with; an aspect not listed: every value)."""

    name: str
    member: T
    summary: str = ""
    supports: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType({}))

    def allows(self, aspect: str, value: str) -> bool:
        """Whether the member works with ``value`` of ``aspect``."""
        return aspect not in self.supports or value in self.supports[aspect]


class Registry(Mapping[str, T], Generic[T]):
    """The members of one pluggable family by name (module docstring).

    ``source`` and ``field`` are what an unknown name's error names (``InputError(source,
    field, "one of ...", name)``); ``load``, when given, is called before every lookup that
    lists or finds members (built-in members that register themselves when their module is
    imported)."""

    def __init__(self, family: str, *, source: str, field: str,
                 load: Callable[[], None] | None = None) -> None:
        self.family = family
        self.source = source
        self.field = field
        self._load = load
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, member: T, *, summary: str = "",
                 supports: Mapping[str, Iterable[str]] | None = None,
                 replace: bool = False) -> T:
        """Add ``member`` under ``name`` and return it; a name registers once unless
        ``replace``. Without a ``summary``, the first line of the member's docstring (or its
        name) is its summary."""
        if name in self._entries and not replace:
            raise ValueError(f"{self.family} {name!r} is already registered")
        if not summary.strip():
            doc = getattr(member, "__doc__", None) or ""
            summary = doc.strip().splitlines()[0] if doc.strip() else name
        frozen = MappingProxyType({k: frozenset(v) for k, v in (supports or {}).items()})
        self._entries[name] = Entry(name, member, summary, frozen)
        return member

    def _ready(self) -> None:
        if self._load is not None:
            self._load()

    def __getitem__(self, name: str) -> T:
        self._ready()
        return self._entries[name].member

    def __iter__(self) -> Iterator[str]:
        self._ready()
        return iter(list(self._entries))

    def __len__(self) -> int:
        self._ready()
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        self._ready()
        return name in self._entries

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self)

    def choices(self) -> str:
        """The names as an error message lists them: sorted, comma-separated."""
        return ", ".join(sorted(self))

    def entry(self, name: str) -> Entry[T]:
        """The entry ``name`` (:meth:`require`'s error otherwise)."""
        self.require(name)
        return self._entries[name]

    def require(self, name: str) -> T:
        """The member ``name``, or an :class:`InputError` listing the choices."""
        self._ready()
        if name not in self._entries:
            raise InputError(self.source, self.field, f"one of {self.choices()}", name)
        return self._entries[name].member

    def check(self, name: str, aspect: str, value: str, *, source: str | None = None,
              field: str | None = None) -> None:
        """Refuse ``value`` of ``aspect`` where the member ``name`` does not support it: an
        :class:`InputError` (naming ``source``/``field``, default the registry's) saying which
        values of ``aspect`` the member works with."""
        entry = self.entry(name)
        if entry.allows(aspect, value):
            return
        works = ", ".join(sorted(entry.supports[aspect]))
        raise InputError(source or self.source, field or self.field,
                         f"{self.family} {name!r} only with {aspect} {works}",
                         f"{aspect} {value}")
