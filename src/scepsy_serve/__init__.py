"""scepsy_serve: running a plan (docs/launch.md, docs/gateway.md, docs/control.md).

* :mod:`scepsy_serve.launch`: plan.json as launch targets read it, the renderers (shell scripts
  with ``vllm serve`` and MPS, Kubernetes, Ray Serve, a routing table), running the shell target
  on this host, the workflow driver and the whole loop on a real engine;
* :mod:`scepsy_serve.gateway`: the routing gateway in front of every replica;
* :mod:`scepsy_serve.control`: keeping a deployment right while its load moves (the decision
  core, telemetry, forecasts, applying a change, the simulated comparison of policies).

Builds on :mod:`scepsy_place` (placed plans), :mod:`scepsy_opt` and :mod:`scepsy_profile`; only
the facade (:mod:`scepsy`) builds on it.
"""
