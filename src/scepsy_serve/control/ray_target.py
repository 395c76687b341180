"""The ``ray`` apply target (docs/control.md): each replica of a plan is one Ray Serve LLM
application (``ray.serve.llm.build_openai_app``) on a running Ray cluster, started, checked and
removed through Ray Serve's own Python API (``serve.run``, ``serve.status``, ``serve.delete``).

One application per replica, so that the controller starts and stops replicas one by one and
the gateway routes to each by its own URL (as with the shell target):

* its name is :func:`app_name` (``scepsy:PLAN:LLM-REPLICA``), its route prefix
  :func:`route_prefix` (``/scepsy/PLAN/LLM-REPLICA``): names escaped by :func:`url_word`, so
  every replica has its own, and its OpenAI base URL is the Serve proxy's address (the first
  planned node, ``engine.base_port``, as ``serve.yaml`` renders it) plus that prefix plus ``/v1``;
* its ``LLMConfig`` is the rendered one (:func:`scepsy_serve.launch.ray.llm_config`) of that
  replica alone: ``num_replicas`` 1, and the replica's share as the engine's placement bundles;
* Serve's own actors of the application (the ``LLMServer`` replica actor and the OpenAI ingress)
  ask for no CPU (``ray_actor_options.num_cpus`` 0; Ray Serve LLM's defaults are 1 each): the
  plan's cores go to the engine's bundles, as ``serve.yaml`` places them, and a one-core replica
  fits one core of the cluster.

Ray Serve LLM imports vLLM, which the controller's Python does not have: ``build_openai_app``
and ``serve.run`` run in a Ray task on the cluster (no CPU asked), whose workers have vLLM, as
every Ray Serve LLM cluster's do. The controller itself needs only ``ray`` (the cluster's
version). :meth:`RayServeTarget.start` returns once the task is submitted;
:meth:`RayServeTarget.healthy` says whether Serve reports the application ``RUNNING`` and its
``/v1/models`` answers through the proxy, and raises :class:`RayTargetError` when the deployment
failed.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from scepsy_serve.control.actuate import register_target
from scepsy_serve.launch.launchplan import LaunchPlan, ReplicaLaunch
from scepsy_serve.launch.ray import SERVE_ACTORS_ON_CPU, llm_config, proxy_host

NAME = "ray"
APP_PREFIX = "scepsy"
CANCEL_WAIT_S = 30.0
NO_CPU: Mapping[str, Any] = {"ray_actor_options": SERVE_ACTORS_ON_CPU}
"""Deployment options of Serve's own actors of a replica's application (module docstring)."""

_PLAIN = re.compile(r"[A-Za-z0-9._-]")


class RayTargetError(RuntimeError):
    """Ray Serve could not deploy a replica: the message says what Serve reported."""


def url_word(text: str) -> str:
    """``text`` as one word of a URL path and of a Serve application name: letters, digits and
    ``. _ -`` as they are, every other byte of its UTF-8 as ``~XX`` (``/`` → ``~2F``, ``~`` →
    ``~7E``), so that no two texts give one word and no ``/`` or ``%`` reaches the path."""
    return "".join(c if _PLAIN.fullmatch(c) else "".join(f"~{b:02X}" for b in c.encode())
                   for c in text)


def replica_word(r: ReplicaLaunch) -> str:
    """Replica ``r`` as one URL word: ``LLM-REPLICA`` (the server name of the other targets),
    the LLM's name escaped by :func:`url_word` (the number after the last ``-`` is the
    replica, so no two replicas share a word)."""
    return f"{url_word(r.llm)}-{r.replica}"


def app_name(plan: LaunchPlan, r: ReplicaLaunch) -> str:
    """The Serve application of replica ``r``: ``scepsy:PLAN:LLM-REPLICA`` (escaped)."""
    return f"{APP_PREFIX}:{url_word(plan.name)}:{replica_word(r)}"


def route_prefix(plan: LaunchPlan, r: ReplicaLaunch) -> str:
    """Where the Serve proxy routes replica ``r``'s application: ``/scepsy/PLAN/LLM-REPLICA``."""
    return f"/{APP_PREFIX}/{url_word(plan.name)}/{replica_word(r)}"


def proxy_url(plan: LaunchPlan) -> str:
    """The Serve proxy's base address: the first planned node's address and
    ``engine.base_port`` (where ``serve.yaml`` and :meth:`RayServeTarget.start` put it)."""
    head = plan.node_names()[0] if plan.replicas else "localhost"
    return f"http://{plan.url_host(head)}:{plan.engine.base_port}"


def http_options(plan: LaunchPlan) -> dict[str, Any]:
    """Serve's ``http_options`` for the plan, as ``serve.yaml`` renders them."""
    return {"host": proxy_host(plan), "port": plan.engine.base_port}


def replica_args(plan: LaunchPlan, r: ReplicaLaunch) -> dict[str, Any]:
    """``build_openai_app``'s arguments (``LLMServingArgs`` as plain data) for replica ``r``
    alone (module docstring)."""
    cfg = llm_config(replace(plan, replicas=(r,)), r.llm)
    cfg["deployment_config"] = {"num_replicas": 1, **_copy(NO_CPU)}
    return {"llm_configs": [cfg], "ingress_deployment_config": _copy(NO_CPU)}


def _copy(m: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, Mapping) else v for k, v in m.items()}


def _text(status: Any) -> str:
    """A Serve status (a ``str`` enum, whose ``str()`` is ``ApplicationStatus.RUNNING``) as its
    value, ``RUNNING``."""
    return str(getattr(status, "value", status))


def _deploy_task() -> Any:
    """The function the deploy task runs on the cluster. Built here, inside a function, so that
    Ray pickles it by value: the cluster's workers need Ray Serve LLM, not scepsy."""

    def deploy(name: str, prefix: str, args: dict[str, Any], http: dict[str, Any]) -> str:
        from ray import serve
        from ray.serve.llm import build_openai_app

        serve.start(http_options=http)
        serve.run(build_openai_app(args), name=name, route_prefix=prefix, blocking=False)
        return name

    return deploy


@dataclass
class RayServeTarget:
    """Replicas as Ray Serve LLM applications on the Ray cluster at ``address`` (``auto``: the
    one this host runs or ``$RAY_ADDRESS``); ``runtime_env`` of the deploy task (e.g.
    ``{"py_executable": "/path/to/vllm/python"}`` where the cluster's default Python has no
    vLLM); ``probe_timeout_s`` for each ``/v1/models`` check."""

    address: str = "auto"
    runtime_env: Mapping[str, Any] | None = None
    probe_timeout_s: float = 5.0
    name: str = NAME
    _tasks: dict[str, Any] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def _connect(self) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.WARNING)

    def start(self, plan: LaunchPlan, replica: ReplicaLaunch) -> None:
        """Submit the deployment of ``replica``'s application (or its update, when it runs);
        returns at once."""
        import ray

        self._connect()
        name = app_name(plan, replica)
        task = ray.remote(num_cpus=0, max_retries=0)(_deploy_task())
        if self.runtime_env:
            task = task.options(runtime_env=dict(self.runtime_env))
        ref = task.remote(name, route_prefix(plan, replica), replica_args(plan, replica),
                          http_options(plan))
        with self._lock:
            self._tasks[name] = ref

    def status(self, plan: LaunchPlan, replica: ReplicaLaunch) -> str | None:
        """Serve's status of ``replica``'s application (``DEPLOYING``, ``RUNNING``,
        ``DEPLOY_FAILED``, ...), None when Serve has no such application."""
        from ray import serve

        self._connect()
        app = serve.status().applications.get(app_name(plan, replica))
        return None if app is None else _text(app.status)

    def healthy(self, plan: LaunchPlan, replica: ReplicaLaunch) -> bool:
        """Whether the application is ``RUNNING`` and ``/v1/models`` answers 200 through the
        proxy. :class:`RayTargetError` when its deployment failed (the deploy task's error or
        Serve's ``DEPLOY_FAILED`` message)."""
        import ray
        from ray import serve

        self._connect()
        name = app_name(plan, replica)
        with self._lock:
            ref = self._tasks.get(name)
        if ref is not None:
            done, _ = ray.wait([ref], timeout=0)
            if done:
                try:
                    ray.get(done[0])
                except Exception as exc:
                    raise RayTargetError(f"Ray Serve could not deploy {name}: "
                                         f"{type(exc).__name__}: {exc}") from None
        app = serve.status().applications.get(name)
        if app is None:
            return False
        status = _text(app.status)
        if status == "DEPLOY_FAILED":
            raise RayTargetError(f"Ray Serve could not deploy {name}: {app.message}")
        if status != "RUNNING":
            return False
        try:
            res = httpx.get(self.url(plan, replica) + "/models", timeout=self.probe_timeout_s)
        except httpx.TransportError:
            return False
        return res.status_code == 200

    def url(self, plan: LaunchPlan, replica: ReplicaLaunch) -> str:
        """The replica's OpenAI base URL through the Serve proxy (ends in ``/v1``)."""
        return proxy_url(plan) + route_prefix(plan, replica) + "/v1"

    def stop(self, plan: LaunchPlan, replica: ReplicaLaunch) -> None:
        """Delete the replica's application (Serve drains its requests first) and wait until
        it is gone; a deployment still in progress is cancelled."""
        import ray
        from ray import serve

        self._connect()
        name = app_name(plan, replica)
        with self._lock:
            ref = self._tasks.pop(name, None)
        if ref is not None and not ray.wait([ref], timeout=0)[0]:
            ray.cancel(ref, force=True)
            ray.wait([ref], timeout=CANCEL_WAIT_S)  # it submits nothing after this
        serve.delete(name, _blocking=True)

    def close(self) -> None:
        """Disconnect from the cluster (what runs there keeps running)."""
        import ray

        with self._lock:
            self._tasks.clear()
        if ray.is_initialized():
            ray.shutdown()


register_target("ray", RayServeTarget)
