"""From a graph, a mesh and a machine to a plan: the sharding options of every op, their costs on
the bound hardware, the formulation as a solver problem, `make_plan`, the plan itself and the
report that prices any plan.

May import: the vocabulary, `ops`, `resharding`, `graph`, `solver`, `pipeline` (the schedules that price a
pipelined plan).
"""
