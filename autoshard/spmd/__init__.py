"""The partitioned (SPMD) program of a plan: each op on its local block, the collectives of every
resharding between ops, and the cost-gated rewrites that lower its communication.

May import: the vocabulary, `ops`, `resharding`, `graph`, `planning`.
"""
