"""Keeping a deployment right while its load moves (docs/control.md): the decision core shared by
the live controller and the simulator (:mod:`scepsy_serve.control.core`), the routing gateway
(:mod:`scepsy_serve.gateway`), live telemetry (:mod:`scepsy_serve.control.telemetry`),
apply targets (:mod:`scepsy_serve.control.actuate`, :mod:`scepsy_serve.control.ray_target`) and the
simulated comparison of control policies (:mod:`scepsy_serve.control.bench`)."""
