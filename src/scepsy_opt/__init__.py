"""scepsy_opt: workflows, traces, statistics, the Aggregate LLM Pipeline predictor, the simulator.

Modules, by concept:

* :mod:`scepsy_opt.traces`: the JSON-lines trace of LLM and tool calls (``read_trace``,
  ``validate_calls``, ``write_trace``);
* :mod:`scepsy_opt.workflows`: workflow YAMLs, the stochastic programs (RAG + reranker, beam
  search + PRM, coding agent) and ``generate_trace``; :mod:`scepsy_opt.mooncake` for real token
  lengths;
* :mod:`scepsy_opt.stats`: per-workflow, per-LLM statistics (``workflow_stats``);
* :mod:`scepsy_opt.allocation`: ``Allocation`` / ``Instance`` and their files;
* :mod:`scepsy_opt.pipeline`: the predictor (``predict``);
* :mod:`scepsy_opt.simulate`: the discrete-event simulator (``simulate``, ``saturation_rate``).
"""
