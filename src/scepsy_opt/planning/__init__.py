"""Planning: the allocation optimiser (docs/optimiser.md), in dependency order.

* :mod:`scepsy_opt.planning.problem`: a planning problem (``PlanningProblem``, ``PlanOptions``,
  ``Deadline``);
* :mod:`scepsy_opt.planning.coverage`: shares outside the profiled range (extrapolated shares,
  the grid restricted to what was measured);
* :mod:`scepsy_opt.planning.candidates`: every way to serve each LLM, priced
  (``generate_candidates``, ``price``);
* :mod:`scepsy_opt.planning.plans`: a plan, its status and diagnosis, and the optimiser protocol;
* :mod:`scepsy_opt.planning.solver`: HiGHS, configured in one place for every MILP and LP;
* :mod:`scepsy_opt.planning.milp`: the exact multiple-choice knapsack MILP;
* :mod:`scepsy_opt.planning.mincost`: the min-cost objective (docs/min-cost.md);
* :mod:`scepsy_opt.planning.mixing`: one LLM's load split over several GPU types;
* :mod:`scepsy_opt.planning.baselines`: the brute-force oracle, the paper's heuristic and the
  other baselines;
* :mod:`scepsy_opt.planning.optimisers`: the registry that names them (``optimiser(name)``);
* :mod:`scepsy_opt.planning.planfile`: ``plan.json``, a plan as a file;
* :mod:`scepsy_opt.planning.instances`: seeded random planning problems, for oracle tests and
  solver benchmarks.
"""
