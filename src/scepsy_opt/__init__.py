"""scepsy_opt: workflows, traces, statistics, the Aggregate LLM Pipeline predictor, the simulator
and the allocation optimiser.

Modules, by concept:

* :mod:`scepsy_opt.traces`: the JSON-lines trace of LLM and tool calls (``read_trace``,
  ``validate_calls``, ``write_trace``);
* :mod:`scepsy_opt.workflows`: workflow YAMLs, the stochastic programs (RAG + reranker, beam
  search + PRM, coding agent) and ``generate_trace``; :mod:`scepsy_opt.mooncake` for real token
  lengths;
* :mod:`scepsy_opt.stats`: per-workflow, per-LLM statistics (``workflow_stats``);
* :mod:`scepsy_opt.allocation`: ``Allocation`` / ``Instance`` and their files;
* :mod:`scepsy_opt.pipeline`: the predictor (``predict``);
* :mod:`scepsy_opt.simulate`: the discrete-event simulator (``simulate``, ``saturation_rate``);
* the optimiser (docs/optimiser.md), in dependency order: :mod:`scepsy_opt.cluster` (GPU pools),
  :mod:`scepsy_opt.problem` (``PlanningProblem``, ``PlanOptions``, ``Deadline``),
  :mod:`scepsy_opt.candidates` (``generate_candidates``, ``price``: every way to serve each LLM,
  priced), :mod:`scepsy_opt.plans` (``Plan``, its status and diagnosis), the optimisers
  :mod:`scepsy_opt.milp` and :mod:`scepsy_opt.baselines`, and the registry that names them
  (:mod:`scepsy_opt.optimisers`, ``optimiser(name)``); :mod:`scepsy_opt.planfile` writes
  ``plan.json``.
"""
