"""Rows for `gather`, `scatter` and `scatter-add` with the index patterns of embedding lookups
and routing.

- Rows of a table picked by ids (`jnp.take(table, ids, axis=0)`, `table[ids]`, a router's
  `x[token_ids]`): the op table's `embedding` (ids [...], table [V, D]; a table of other rank
  flattened to that), whose V loop splits as a sum of masked lookups (vocabulary-parallel) and
  whose other loops are the ids' and D.
- One entry per row picked along the last dim (`jnp.take_along_axis(x, idx, axis=-1)`, how the
  top-k probabilities are read back): a `dot_general` of `one_hot(idx)` with `x`, batched over
  the leading dims, contracting the picked dim (2 FLOPs per candidate entry, exact values).
- Rows of updates written or summed into the rows their ids name (`table.at[ids].add(rows)`, an
  embedding's gradient; `out.at[token_ids].set(y)`, a router's combine): the op table's `scatter`
  and `scatter_add` (whose updates split as partial sums), plus an `add` of the operand.
- Entries summed into the last dim at one index per row (`take_along_axis`'s gradient): a
  `dot_general` of `one_hot(idx)` with the updates, plus an `add` of the operand.
- Single entries named by a full index each (`x[rows, idx]`, `.at[arange(T)[:, None], idx].set(w)`,
  `jnp.put_along_axis`: a router's weights spread over [tokens, experts]): the operand flattened
  to one dim of rows, each index vector made the id of its entry there (`i0 * n1 + i1`), then
  the rows patterns above.

Out-of-range ids read as zero rows, where jax's default `fill` mode gives NaN (scatters drop them,
as jax does); `clip` mode clamps them first, as jax does.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.frontends.jax.rows import Emit, Unsupported
from autoshard.frontends.jax.trace import Atom, FlatEqn


def gather(e: Emit, eqn: FlatEqn) -> list[str]:
    numbers = eqn.params["dimension_numbers"]
    operand, indices = eqn.inputs
    shape, ids_shape = e.shape(operand), e.shape(indices)
    sizes = tuple(int(s) for s in eqn.params["slice_sizes"])
    last = len(shape) - 1
    if not ids_shape or tuple(numbers.start_index_map) != tuple(numbers.collapsed_slice_dims):
        raise Unsupported(f"gather {numbers} keeps a dim it indexes")
    ids_rank = len(ids_shape) - 1
    if _names_entries(numbers.start_index_map, numbers.offset_dims, numbers.operand_batching_dims, shape, ids_shape):
        table = e.op("reshape", [e.tensor(operand)], shape=[_size(shape), 1])
        rows = e.op("embedding", [_entry_ids(e, eqn, indices, shape), table])
        return [e.op("reshape", [rows], shape=list(e.shape(eqn.outputs[0])))]
    if ids_shape[-1] != 1:
        raise Unsupported(f"gather {numbers} indexes {ids_shape[-1]} of {len(shape)} dims per index")
    # rows: a table [V, ...], each id picking a whole row (its dims land after the ids' dims)
    if (not numbers.operand_batching_dims and tuple(numbers.collapsed_slice_dims) == (0,)
            and sizes == (1,) + shape[1:] and tuple(numbers.offset_dims) == tuple(range(ids_rank, ids_rank + last))):
        return [_rows(e, eqn, operand, indices)]
    # along the last dim: every leading dim a batch dim shared with the ids, one entry picked per id
    if (tuple(numbers.operand_batching_dims) == tuple(range(last)) == tuple(numbers.start_indices_batching_dims)
            and tuple(numbers.collapsed_slice_dims) == (last,) and not numbers.offset_dims
            and sizes == (1,) * len(shape) and ids_shape[:last] == shape[:last]):
        return [_along_last(e, eqn, operand, indices)]
    raise Unsupported(f"gather {numbers} with slice_sizes {sizes} is neither rows of a table picked by ids nor "
                      "entries picked along the last dim")


def _ids(e: Emit, eqn: FlatEqn, indices: Atom, bound: int) -> str:
    """The indices without their trailing index dim, clamped to [0, bound) in clip mode."""
    ids_shape = list(e.shape(indices))
    ids = e.op("reshape", [e.tensor(indices)], shape=ids_shape[:-1])
    if str(eqn.params["mode"]).endswith("CLIP"):
        dtype = e.dtype(indices)
        ids = e.op("max", [e.op("min", [ids, e.constant(bound - 1, dtype)]), e.constant(0, dtype)])
    return ids


def _names_entries(index_map: Sequence[int], window_dims: Sequence[int], batching_dims: Sequence[int],
                   shape: Sequence[int], ids_shape: Sequence[int]) -> bool:
    """Whether each index vector names one entry: it indexes every dim of an operand of rank 2 or
    more, in order, and no window or batch dim is left."""
    return (len(shape) >= 2 and tuple(index_map) == tuple(range(len(shape))) and ids_shape[-1] == len(shape)
            and not window_dims and not batching_dims)


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(shape))


def _entry_ids(e: Emit, eqn: FlatEqn, indices: Atom, shape: Sequence[int]) -> str:
    """Each index vector as the position of its entry in the operand flattened (row-major); an
    index out of its dim's range makes it -1 (read as zero, dropped by scatters), or is clamped
    into it in clip mode."""
    lead, dtype = list(e.shape(indices)[:-1]), e.dtype(indices)
    clip = str(eqn.params["mode"]).endswith("CLIP")
    ids = inside = None
    for dim, size in enumerate(shape):
        column = e.op("slice", [e.tensor(indices)], starts=[0] * len(lead) + [dim], limits=lead + [dim + 1],
                      strides=[1] * (len(lead) + 1))
        index = e.op("reshape", [column], shape=lead)
        if clip:
            index = e.op("max", [e.op("min", [index, e.constant(size - 1, dtype)]), e.constant(0, dtype)])
        else:
            fits = e.op("mul", [e.op("compare", [index, e.constant(0, dtype)], direction="ge"),
                                e.op("compare", [index, e.constant(size, dtype)], direction="lt")])
            inside = fits if inside is None else e.op("mul", [inside, fits])
        ids = index if ids is None else e.op("add", [e.op("mul", [ids, e.constant(size, dtype)]), index])
    # select(which, a, b) is b where which holds
    return ids if inside is None else e.op("select", [inside, e.constant(-1, dtype), ids])


def _rows(e: Emit, eqn: FlatEqn, operand: Atom, indices: Atom) -> str:
    """An embedding of the table's rows, each flattened to one dim."""
    shape = e.shape(operand)
    flat = len(shape) != 2
    table = e.op("reshape", [e.tensor(operand)], shape=[shape[0], _size(shape[1:])]) if flat else e.tensor(operand)
    rows = e.op("embedding", [_ids(e, eqn, indices, shape[0]), table])
    return e.op("reshape", [rows], shape=list(e.shape(eqn.outputs[0]))) if flat else rows


def _along_last(e: Emit, eqn: FlatEqn, operand: Atom, indices: Atom) -> str:
    shape = e.shape(operand)
    last = len(shape) - 1
    hot = e.op("one_hot", [_ids(e, eqn, indices, shape[-1])], num_classes=shape[-1], dtype=e.dtype(operand))
    batch = list(range(last))
    return e.op("dot_general", [hot, e.tensor(operand)], lhs_batch_dims=batch, rhs_batch_dims=batch,
                lhs_contracting_dims=[last + 1], rhs_contracting_dims=[last])


def scatter(e: Emit, eqn: FlatEqn) -> list[str]:
    """`scatter` (rows written at ids) and `scatter-add` (summed into them)."""
    numbers = eqn.params["dimension_numbers"]
    operand, indices, updates = eqn.inputs
    shape, ids_shape, updates_shape = e.shape(operand), e.shape(indices), e.shape(updates)
    adds = eqn.primitive.name == "scatter-add"
    if not ids_shape or tuple(numbers.scatter_dims_to_operand_dims) != tuple(numbers.inserted_window_dims):
        raise Unsupported(f"scatter {numbers} keeps a dim it indexes")
    ids_rank, last = len(ids_shape) - 1, len(shape) - 1
    if (_names_entries(numbers.scatter_dims_to_operand_dims, numbers.update_window_dims, numbers.operand_batching_dims,
                       shape, ids_shape) and updates_shape == ids_shape[:-1]):
        flat = e.op("reshape", [e.tensor(operand)], shape=[_size(shape)])
        ids = _entry_ids(e, eqn, indices, shape)
        if adds:
            written = e.op("add", [flat, e.op("scatter_add", [ids, e.tensor(updates)], rows=_size(shape))])
        else:
            written = e.op("scatter", [flat, ids, e.tensor(updates)])
        return [e.op("reshape", [written], shape=list(shape))]
    if ids_shape[-1] != 1:
        raise Unsupported(f"{eqn.primitive.name} {numbers} indexes {ids_shape[-1]} of {len(shape)} dims per index")
    if (not numbers.operand_batching_dims and tuple(numbers.inserted_window_dims) == (0,)
            and tuple(numbers.update_window_dims) == tuple(range(ids_rank, len(updates_shape)))
            and updates_shape == ids_shape[:-1] + shape[1:]):
        ids = _ids(e, eqn, indices, shape[0])
        if not adds:
            return [e.op("scatter", [e.tensor(operand), ids, e.tensor(updates)])]
        summed = e.op("scatter_add", [ids, e.tensor(updates)], rows=shape[0])
        return [e.op("add", [e.tensor(operand), summed])]
    if (adds and tuple(numbers.operand_batching_dims) == tuple(range(last))
            == tuple(numbers.scatter_indices_batching_dims) and tuple(numbers.inserted_window_dims) == (last,)
            and not numbers.update_window_dims and ids_shape[:last] == shape[:last]
            and updates_shape == ids_shape[:-1]):
        hot = e.op("one_hot", [_ids(e, eqn, indices, shape[-1])], num_classes=shape[-1], dtype=e.dtype(operand))
        batch = list(range(last))
        summed = e.op("dot_general", [e.tensor(updates), hot], lhs_batch_dims=batch, rhs_batch_dims=batch,
                      lhs_contracting_dims=[last], rhs_contracting_dims=[last])
        return [e.op("add", [e.tensor(operand), summed])]
    raise Unsupported(f"{eqn.primitive.name} {numbers} is neither rows written at ids nor entries summed along "
                      "the last dim")
