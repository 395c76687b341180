"""scepsy_opt: workflows, traces, statistics, the Aggregate LLM Pipeline predictor, the simulator
and the allocation optimiser.

Modules, by concern. At the top, the data model every stage shares:

* :mod:`scepsy_opt.traces`: the JSON-lines trace of LLM and tool calls (``read_trace``,
  ``validate_calls``, ``write_trace``);
* :mod:`scepsy_opt.workflows`: workflow YAMLs, the stochastic programs (RAG + reranker, beam
  search + PRM, coding agent) and ``generate_trace``;
* :mod:`scepsy_opt.workload` (workflows served together, their rates), :mod:`scepsy_opt.ratework`
  (rate-driven workloads) and :mod:`scepsy_opt.arrivals` (recorded arrival times);
* :mod:`scepsy_opt.stats`: per-workflow, per-LLM statistics (``workflow_stats``);
* :mod:`scepsy_opt.allocation`: ``Allocation`` / ``Instance`` and their files;
* :mod:`scepsy_opt.cluster`: GPU pools, as the optimiser sees a cluster.

Then three sub-packages (each ``__init__`` lists its modules):

* :mod:`scepsy_opt.ingest`: traces from outside (OpenTelemetry spans, the OTLP/HTTP receiver,
  the recording proxy, the trace map, Mooncake token lengths);
* :mod:`scepsy_opt.prediction`: the predictor (:mod:`scepsy_opt.prediction.pipeline`,
  ``predict``), tails, MPS co-location, SLOs, the discrete-event simulator
  (:mod:`scepsy_opt.prediction.simulate`) and the ``--json`` reports;
* :mod:`scepsy_opt.planning`: the optimiser (docs/optimiser.md): the problem, candidates, plans,
  the MILP, min-cost, mixing, the baselines and the registry that names them
  (:mod:`scepsy_opt.planning.optimisers`, ``optimiser(name)``), and ``plan.json``
  (:mod:`scepsy_opt.planning.planfile`);

and :mod:`scepsy_opt.validate`, measured runs against the predictor and the simulator.
"""
