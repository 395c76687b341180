"""scepsy_opt.planning.solver is the one home of the HiGHS settings: both factories configure a solver the
same way, importing the module prints and creates nothing, and the first solver's banner never
reaches stdout."""

from __future__ import annotations

import subprocess
import sys

import pulp

from scepsy_opt.planning import milp, solver


def _option(h: object, name: str) -> object:
    value = h.getOptionValue(name)  # type: ignore[attr-defined]
    return value[1] if isinstance(value, tuple) else value  # (status, value) in highspy 1.16


def test_highs_factory_settings() -> None:
    h = solver.highs(2.5, gap_rel=1e-3, gap_abs=0.0, presolve="off")
    got = {k: _option(h, k) for k in ("output_flag", "threads", "random_seed",
                                            "time_limit", "mip_rel_gap", "mip_abs_gap",
                                            "presolve")}
    assert got == {"output_flag": False, "threads": 1, "random_seed": solver.SEED,
                   "time_limit": 2.5, "mip_rel_gap": 1e-3, "mip_abs_gap": 0.0,
                   "presolve": "off"}


def test_pulp_factory_and_status_agree() -> None:
    prob = pulp.LpProblem("t", pulp.LpMinimize)
    x = prob.add_variable("x", 0, 3, pulp.LpInteger)
    prob += pulp.LpAffineExpression([(x, 1.0)])
    prob += pulp.LpAffineExpression([(x, 2.0)]) >= 3, "c"
    prob.solve(solver.pulp_highs(5.0, gap_rel=0.0, mip_feasibility_tolerance=1e-9))
    h = prob.solverModel
    assert _option(h, "threads") == 1 and _option(h, "random_seed") == solver.SEED
    assert _option(h, "mip_feasibility_tolerance") == 1e-9
    assert solver.highs_status(h) == ("optimal", 2.0, 2.0) and solver.has_solution(h)
    prob += pulp.LpAffineExpression([(x, 1.0)]) <= 1, "d"
    prob.solve(solver.pulp_highs(5.0))
    assert solver.highs_status(prob.solverModel)[0] == "infeasible"


def test_old_names_point_at_the_new_home() -> None:
    assert milp.SOLVER is solver.SOLVER and milp.SEED == solver.SEED
    assert solver.SOLVER.startswith("HiGHS ")


def test_no_import_side_effect_and_no_banner() -> None:
    code = ("import sys, scepsy_opt.planning.solver as s\n"
            "assert not s._banner_done\n"
            "s.highs(1.0)\n"
            "print('done')\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert run.stdout == "done\n"
