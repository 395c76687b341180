"""Prediction: what a workload gets on an allocation, in closed form or simulated.

* :mod:`scepsy_opt.prediction.pipeline`: the Aggregate LLM Pipeline predictor (``predict``,
  docs/predictor.md);
* :mod:`scepsy_opt.prediction.tails`: tail latency (p50/p90/p99) of a workflow's requests
  (docs/tails.md);
* :mod:`scepsy_opt.prediction.colocation`: LLMs sharing GPUs under MPS limits, the shares they
  get from each other;
* :mod:`scepsy_opt.prediction.slo`: per-LLM latency SLOs (TTFT, TPOT) and their attainment
  (docs/slo.md);
* :mod:`scepsy_opt.prediction.simulate`: the discrete-event simulator (``simulate``,
  ``saturation_rate``, docs/simulator.md);
* :mod:`scepsy_opt.prediction.schedule`: allocations that change over a simulated run
  (``AllocationChange``) and when each replica was up (``ReplicaSpan``);
* :mod:`scepsy_opt.prediction.priority`: program-level priorities (least attained service) that
  the gateway sets and the simulator's queues follow (docs/gateway.md);
* :mod:`scepsy_opt.prediction.reports`: predictions and simulation results as plain dicts (the
  CLI's ``--json`` documents).
"""
