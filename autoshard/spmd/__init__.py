"""The partitioned (SPMD) program of a plan: each op on its local block, the collectives of every
resharding between ops, the cost-gated rewrites that lower its communication, and a training
step cut into pipeline slots (`staged`).

May import: the vocabulary, `ops`, `resharding`, `graph`, `pipeline`, `planning`.
"""
