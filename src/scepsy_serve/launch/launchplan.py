"""What a launcher needs from a plan (docs/launch.md): every replica with its node, GPU indices,
share, memory and port; every LLM with the model its engine loads; the devices' kind and memory;
the workflows' LLMs. Built from plan.json by :func:`scepsy_serve.launch.planfile.load_plan`;
renderers read only this.

Ports are assigned here, deterministically: on each node, the replicas sorted by (LLM, replica)
take ``base_port``, ``base_port + 1``, ... so the same plan gives the same ports on any machine.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from scepsy_common.errors import InputError

DeviceKind = Literal["cuda", "cpu"]
DEFAULT_BASE_PORT = 8000
DEFAULT_COMMAND: tuple[str, ...] = ("vllm", "serve")
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""An environment variable's name as every launch target accepts it (and a shell can set)."""
ENV_NAME_MAX = 256
ENV_NAME_EXPECTED = (f"an environment variable name of 1 to {ENV_NAME_MAX} letters, digits "
                     "and _, not a digit first")
TEXT_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]*$"
"""Text that reaches a command line or an environment (an argument, an environment value):
no control character (newline, tab, NUL, escape, ...), so it stays one word of one line."""
TEXT_MAX = 4096
TEXT_EXPECTED = (f"text of at most {TEXT_MAX} characters with no control character (newline, "
                 "tab, NUL, escape, ...)")
WORD_PATTERN = r"^[^\x00-\x1f\x7f-\x9f]+$"
WORD_EXPECTED = (f"non-empty text of at most {TEXT_MAX} characters with no control character "
                 "(newline, tab, NUL, escape, ...)")
HOST_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.:_-]*$"
HOST_MAX = 253
HOST_EXPECTED = (f"a host name or IP address of at most {HOST_MAX} characters: a letter or "
                 "digit, then letters, digits and . : _ -")
_ENV_NAME_RE = re.compile(ENV_NAME_PATTERN)
_TEXT_RE = re.compile(TEXT_PATTERN)


_HOSTNAME = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")


def url_host(address: str) -> str | None:
    """``address`` as the host part of a URL: a host name or an IPv4 address as it is, an IPv6
    address in brackets; ``None`` when it is neither."""
    if _HOSTNAME.match(address) and ".." not in address:
        return address
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    return f"[{address}]" if ip.version == 6 else address


def file_name(name: str) -> str:
    """``name`` as one file or folder name: ``/`` written ``%2F`` (``%`` is not a name
    character, so no two names become one)."""
    return name.replace("/", "%2F")


def server_name(llm: str, replica: int) -> str:
    """A replica's server name, ``LLM-REPLICA``, usable as one file name (:func:`file_name`),
    so that its log and pid files stay in their folders."""
    return f"{file_name(llm)}-{replica}"


def check_env_name(name: object, source: str, field: str) -> str:
    """``name`` if it is an environment variable name (:data:`ENV_NAME_PATTERN`), else an
    :class:`~scepsy_common.errors.InputError` saying :data:`ENV_NAME_EXPECTED`."""
    if not (isinstance(name, str) and len(name) <= ENV_NAME_MAX
            and _ENV_NAME_RE.fullmatch(name)):
        raise InputError(source, field, ENV_NAME_EXPECTED, name)
    return name


def check_text(value: object, source: str, field: str) -> str:
    """``value`` if it is :data:`TEXT_PATTERN` text (an argument, an environment value), else
    an :class:`~scepsy_common.errors.InputError` saying :data:`TEXT_EXPECTED`."""
    if not (isinstance(value, str) and len(value) <= TEXT_MAX and _TEXT_RE.fullmatch(value)):
        raise InputError(source, field, TEXT_EXPECTED, value)
    return value


def _frozen(m: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(sorted(m.items())))


@dataclass(frozen=True)
class DeviceLaunch:
    """A device type of the plan: ``cuda`` (a GPU: MPS shares, ``CUDA_VISIBLE_DEVICES``) or
    ``cpu`` (a CPU core is the unit the plan shares: a test target, docs/quickstart.md)."""

    name: str
    kind: DeviceKind
    memory_gib: float


@dataclass(frozen=True)
class ModelLaunch:
    """One LLM of the plan: its catalog model and what its engine serves.

    ``serve``: what the engine loads (a Hugging Face repo id or a local folder); the server
    answers to the LLM's name (``--served-model-name``). ``args``/``env``: extra engine
    arguments and environment for this LLM's replicas only."""

    llm: str
    model: str
    serve: str
    gpu: str
    tp: int
    share: float
    replicas: int
    memory_gib: float  # per GPU of one replica
    weights_gib: float  # the whole model's weights (split over tp GPUs)
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", _frozen(self.env))


@dataclass(frozen=True)
class EngineLaunch:
    """How every replica's server is started: the command before the model (``vllm serve``,
    or ``python -m vllm.entrypoints.openai.api_server --model`` where the console command does
    not work), arguments and environment added to every server, the first port, and how long a
    server may take to answer ``/health``."""

    command: tuple[str, ...] = DEFAULT_COMMAND
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    base_port: int = DEFAULT_BASE_PORT
    health_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", _frozen(self.env))


@dataclass(frozen=True)
class ReplicaLaunch:
    """One replica: ``tp = len(gpus)`` GPU indices of ``node``, each giving it ``share`` of
    its compute and ``memory_gib`` of its memory; its server listens on ``port``."""

    llm: str
    replica: int
    node: str
    gpus: tuple[int, ...]
    share: float
    memory_gib: float
    port: int

    @property
    def tp(self) -> int:
        return len(self.gpus)

    @property
    def name(self) -> str:
        """``LLM-REPLICA`` (:func:`server_name`): unique in the plan (log, pid and object names
        derive from it)."""
        return server_name(self.llm, self.replica)


@dataclass(frozen=True)
class Assignment:
    """What a rendered target says about one replica, for round trips (plan → render → parse
    back): fields a target cannot express are None (Ray chooses nodes and GPUs itself)."""

    llm: str
    replica: int
    tp: int
    share: float
    node: str | None
    gpus: tuple[int, ...] | None


@dataclass(frozen=True)
class LaunchPlan:
    """The launch view of one plan.json (module docstring)."""

    name: str  # the cluster's name
    version: int
    devices: Mapping[str, DeviceLaunch]  # device type name -> device
    nodes: Mapping[str, str]  # node -> its device type name
    addresses: Mapping[str, str]  # node -> host clients reach it at (default: the node name)
    models: Mapping[str, ModelLaunch]  # LLM -> model
    replicas: tuple[ReplicaLaunch, ...]  # sorted by (llm, replica)
    workflows: Mapping[str, tuple[str, ...]]  # workflow -> its LLMs, sorted
    engine: EngineLaunch = EngineLaunch()
    # an LLM the workflows call that runs as replica groups on several GPU types (plan.json's
    # ``splits``): its groups (LLMs of ``models``) and the fraction of its calls each gets
    splits: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # a split LLM routed by prompt length (plan.json's ``lengths``): per group, its input tokens
    # [lo, hi) (hi None: no upper end)
    lengths: Mapping[str, Mapping[str, tuple[int, int | None]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("devices", "nodes", "addresses", "models", "workflows"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        object.__setattr__(self, "splits", MappingProxyType(
            {m: MappingProxyType(dict(sorted(v.items()))) for m, v in sorted(self.splits.items())}))
        object.__setattr__(self, "lengths", MappingProxyType(
            {m: MappingProxyType(dict(sorted(v.items()))) for m, v in sorted(self.lengths.items())}))
        object.__setattr__(self, "replicas",
                           tuple(sorted(self.replicas, key=lambda r: (r.llm, r.replica))))

    def called(self, workflow: str) -> dict[str, tuple[tuple[str, float], ...]]:
        """The LLMs ``workflow`` calls, each with the LLMs of the plan that serve its calls and
        the fraction each gets: itself (1) or, when split, its replica groups."""
        group_of = {g: m for m, parts in self.splits.items() for g in parts}
        out: dict[str, tuple[tuple[str, float], ...]] = {}
        for g in self.workflows[workflow]:
            m = group_of.get(g, g)
            out[m] = tuple(self.splits[m].items()) if m in self.splits else ((g, 1.0),)
        return dict(sorted(out.items()))

    def tokens(self, group: str) -> tuple[int, int | None] | None:
        """The input-token range of a group of an LLM routed by prompt length, else None."""
        for ranges in self.lengths.values():
            if group in ranges:
                return ranges[group]
        return None

    def node_names(self) -> tuple[str, ...]:
        """Nodes that run at least one replica, sorted."""
        return tuple(sorted({r.node for r in self.replicas}))

    def replicas_on(self, node: str) -> tuple[ReplicaLaunch, ...]:
        return tuple(r for r in self.replicas if r.node == node)

    def replicas_of(self, llm: str) -> tuple[ReplicaLaunch, ...]:
        return tuple(r for r in self.replicas if r.llm == llm)

    def device_of(self, node: str) -> DeviceLaunch:
        return self.devices[self.nodes[node]]

    def address(self, node: str) -> str:
        return self.addresses.get(node, node)

    def url_host(self, node: str, source: str = "plan") -> str:
        """``node``'s address as a URL's host (:func:`url_host`), or an :class:`InputError`
        naming ``launch.addresses`` when the address (the node's name if none is given) is no
        host name or IP address (a name such as ``rack:1`` or ``a/b``)."""
        host = url_host(self.address(node))
        if host is None:
            raise InputError(source, f"launch.addresses.{node}",
                             f"an address for node {node} (a host name or an IP address): "
                             f"{self.address(node)!r} is neither, so its servers cannot be "
                             "reached at it", self.addresses.get(node))
        return host

    def assignments(self) -> frozenset[Assignment]:
        """Every replica's full assignment (what the shell target expresses exactly)."""
        return frozenset(Assignment(r.llm, r.replica, r.tp, r.share, r.node, r.gpus)
                         for r in self.replicas)


def assign_ports(replicas: tuple[ReplicaLaunch, ...], base_port: int) -> tuple[ReplicaLaunch, ...]:
    """``replicas`` with ports: per node, sorted by (llm, replica), from ``base_port`` up."""
    out = []
    per_node: dict[str, int] = {}
    for r in sorted(replicas, key=lambda r: (r.node, r.llm, r.replica)):
        i = per_node.get(r.node, 0)
        per_node[r.node] = i + 1
        out.append(replace(r, port=base_port + i))
    return tuple(sorted(out, key=lambda r: (r.llm, r.replica)))
