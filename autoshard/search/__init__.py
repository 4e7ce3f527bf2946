"""Configuration search: which mesh, and how it lies on the machine, for a device count and a
topology. Enumerates the candidate meshes and placements, bounds each one from below, solves the
promising ones in parallel (local processes or Ray) and ranks them.

May import: the vocabulary, `graph`, `planning`, `delivery` (and `cost_models`); Ray only when asked for.
"""
