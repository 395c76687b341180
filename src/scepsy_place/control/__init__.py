"""Keeping a deployment right while its load moves (docs/control.md): the decision core shared by
the live controller and the simulator (:mod:`scepsy_place.control.core`), the routing gateway
(:mod:`scepsy_place.control.gateway`), live telemetry (:mod:`scepsy_place.control.telemetry`),
apply targets (:mod:`scepsy_place.control.apply`, :mod:`scepsy_place.control.ray_target`) and the
simulated comparison of control policies (:mod:`scepsy_place.control.bench`)."""
