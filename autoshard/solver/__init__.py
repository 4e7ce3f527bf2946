"""The sharding optimisation problem (the IOPDDL contest format) and its solvers.

`Problem` is the instance; `read_iopddl` / `write_iopddl` its JSON form; `score` the contest's
scoring; `solve` the anytime solver (CP-SAT for small instances, memory relaxation + TRW-S +
local search + CP-SAT neighbourhoods for large ones), returning a `Result` with a certified
lower bound.

May import: `errors` only: the solver knows problems, not graphs.
"""

from autoshard.solver.problem import FORBIDDEN_COST, Problem, Score, read_iopddl, score, write_iopddl
from autoshard.solver.solve import Result, solve

__all__ = ["FORBIDDEN_COST", "Problem", "Result", "Score", "read_iopddl", "score", "solve", "write_iopddl"]
