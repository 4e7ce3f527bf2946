"""The computation graph: tensors and ops (each op a row of the op table applied to named
tensors), its JSON form `autoshard.graph/v1`, a builder that writes such documents op by op, and
the reference evaluator that runs a graph unsharded in numpy.

May import: the vocabulary (`errors`, `dtypes`, `affine`, `reductions`, `mesh`, `sharding`) and `ops`.
"""
