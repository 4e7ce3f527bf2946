"""Frameworks' programs in, plans back out in the framework's own vocabulary: one subpackage per
framework (`torch`, `jax`), each importing a program as an `autoshard.graph/v1` graph and turning
a plan into that framework's shardings and a runnable, sharded program.

A framework is an optional extra: nothing here is imported by the rest of autoshard, and a
subpackage imports its framework only when used, with a clear error naming the extra to install.

May import: everything below it (`graph`, `planning`, `delivery` and what they import).
"""
