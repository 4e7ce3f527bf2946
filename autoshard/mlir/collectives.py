"""One `CollectiveStep` as the dialect's collective op, on one device's buffers.

`all_gather`, `all_slice`, `all_to_all`, `all_reduce` and `reduce_scatter` map one to one. A
`permute` is a `shift` (with `rotate`) when every device receives its whole new buffer from the
device a fixed offset away along one mesh axis; otherwise it is printed as rounds of `send`/`recv`
(a device sends at most one tile and receives at most one tile per round) whose peers and tile
boxes come from a per-device table indexed by the process's linear index. Idle devices exchange
an empty tile with themselves. Every transfer of the step appears exactly once.

An `update_halo` fills a zeroed buffer of the new halo shape (zeros: the padding the simulator
holds outside the tensor). The `mesh` spelling is the reference's `mesh.update_halo %src into %dst`
with both halo sizes; upstream's `shard.update_halo` works in place on its destination, so the
block is first copied into the buffer there. A step that only shrinks halos sends nothing and is
a local `tensor.extract_slice` in both spellings.
"""

from __future__ import annotations

from typing import Callable, Sequence

from autoshard.mesh import Device, Mesh
from autoshard.mlir.device import DeviceIndex
from autoshard.mlir.dialect import Dialect
from autoshard.mlir.linalg import Operand, Spec, empty, filled
from autoshard.mlir.module import MESH_SYMBOL, axes_list
from autoshard.mlir.text import Body, int_list, tensor_type
from autoshard.resharding import CollectiveStep, Transfer, step_kind

Printer = Callable[[Body, Dialect, Mesh, CollectiveStep, Operand, Spec, DeviceIndex, str], Operand]


def emit_step(b: Body, dialect: Dialect, mesh: Mesh, step: CollectiveStep, x: Operand, out: Spec,
              device: DeviceIndex, hint: str) -> Operand:
    return STEP_PRINTERS[step_kind(step.kind).name](b, dialect, mesh, step, x, out, device, hint)


def _collective(b: Body, dialect: Dialect, mesh: Mesh, step: CollectiveStep, x: Operand, out: Spec,
                device: DeviceIndex, hint: str) -> Operand:
    """The dialect's collective op of the step's kind, with its attributes in the table's order."""
    kind = step_kind(step.kind)
    attrs = " ".join(f"{k} = {dialect.reduction(step.dims[k]) if k == 'reduction' else step.dims[k]}"
                     for k in kind.attrs)
    cut = step.dims[kind.cut] if kind.cut is not None else None
    if cut is not None and isinstance(x.sizes[cut], int) and x.sizes[cut] % mesh.group_size(step.mesh_axes):
        x = _dynamic(b, x, cut)
    # The verifier wants a dim the collective touches to be dynamic in the result where it is in the input.
    touched = {step.dims[k] for k in kind.dim_attrs}
    result = Spec(out.shape, out.dtype, tuple("?" if d in touched and isinstance(x.sizes[d], str) else size
                                              for d, size in enumerate(out.sizes)))
    name = b.name(hint)
    b.emit(f"{name} = {dialect.op(step.kind)} {x.name} on {MESH_SYMBOL} {dialect.axes_attr} = "
           f"{axes_list(mesh, step.mesh_axes)} {attrs} : {x.type} -> {result.type}")
    if result.type != out.type:
        cast = b.name(hint)
        b.emit(f"{cast} = tensor.cast {name} : {result.type} to {out.type}")
        name = cast
    return Operand(name, out)


def _dynamic(b: Body, x: Operand, dim: int) -> Operand:
    """`x` with `dim` made dynamic: the dialect's verifier wants a static dim that a collective
    cuts to divide evenly, while the reference cuts uneven dims into ceildiv pieces."""
    spec = Spec(x.shape, x.dtype, tuple("?" if d == dim else s for d, s in enumerate(x.sizes)))
    name = b.name("uneven")
    b.emit(f"{name} = tensor.cast {x.name} : {x.type} to {spec.type}")
    return Operand(name, spec)


def _shift(mesh: Mesh, step: CollectiveStep, x: Operand, out: Spec) -> tuple[str, int] | None:
    """(axis, offset) when the permute moves every whole buffer `offset` places along one axis."""
    transfers: Sequence[Transfer] = step.dims["transfers"]
    if x.shape != out.shape or len(transfers) != mesh.num_devices:
        return None
    whole = tuple((0, s) for s in x.shape)
    moves = set()
    for t in transfers:
        if t.source_box != whole or t.target_box != whole:
            return None
        moved = [i for i, (a, c) in enumerate(zip(t.source, t.target)) if a != c]
        if len(moved) != 1:
            return None
        axis = moved[0]
        moves.add((axis, (t.target[axis] - t.source[axis]) % mesh.shape[axis]))
    if len(moves) != 1:
        return None
    axis, offset = moves.pop()
    name = mesh.axis_names[axis]
    return (name, offset) if name in step.mesh_axes else None


def _rounds(transfers: Sequence[Transfer]) -> list[list[Transfer]]:
    """Transfers between distinct devices in rounds where a device sends once and receives once."""
    rounds: list[tuple[set[Device], set[Device], list[Transfer]]] = []
    for t in transfers:
        if t.source == t.target:
            continue
        for senders, receivers, members in rounds:
            if t.source not in senders and t.target not in receivers:
                break
        else:
            senders, receivers, members = set(), set(), []
            rounds.append((senders, receivers, members))
        senders.add(t.source)
        receivers.add(t.target)
        members.append(t)
    return [members for _, _, members in rounds]


def _permute(b: Body, dialect: Dialect, mesh: Mesh, step: CollectiveStep, x: Operand, out: Spec,
             device: DeviceIndex, hint: str) -> Operand:
    shift = _shift(mesh, step, x, out)
    if shift is not None:
        axis, offset = shift
        return emit_shift(b, dialect, mesh, step.mesh_axes, axis, offset, x, out, hint)
    transfers: Sequence[Transfer] = step.dims["transfers"]
    rank, axes, devices = len(x.shape), step.mesh_axes, list(mesh.devices())
    tile = tensor_type(["?"] * rank, x.dtype)
    buffer = empty(b, out, "received")
    kept = {t.target: t for t in transfers if t.source == t.target}
    if kept:
        # The tile of its new buffer each device already holds (an empty one where it holds none).
        row = _table(b, device, [_box(kept.get(d), True, rank) + _box(kept.get(d), False, rank)[:rank] for d in devices], "kept")
        piece = _cut(b, x, row[:rank], row[rank:2 * rank], tile)
        buffer = _insert(b, buffer, piece, row[2 * rank:], row[rank:2 * rank], tile, hint)
    group, peers = axes_list(mesh, axes), len(axes)
    types = ", ".join([tile] + ["index"] * peers)
    for members in _rounds(transfers):
        sends = {t.source: t for t in members}
        receives = {t.target: t for t in members}
        rows = [list(mesh.in_group_index(sends[d].target if d in sends else d, axes)) + _box(sends.get(d), True, rank)
                + list(mesh.in_group_index(receives[d].source if d in receives else d, axes)) + _box(receives.get(d), False, rank)
                for d in devices]
        row = _table(b, device, rows, "round")
        destination, source_box = row[:peers], row[peers:peers + 2 * rank]
        source, target_box = row[peers + 2 * rank:2 * peers + 2 * rank], row[2 * peers + 2 * rank:]
        piece = _cut(b, x, source_box[:rank], source_box[rank:], tile)
        sent = b.name("sent")
        b.emit(f"{sent} = {dialect.op('send')} {piece} on {MESH_SYMBOL} {dialect.axes_attr} = {group} "
               f"destination = [{', '.join(destination)}] : ({types}) -> {tile}")
        landing = b.name("landing")
        b.emit(f"{landing} = tensor.empty({', '.join(target_box[rank:])}) : {tile}")
        got = b.name("got")
        b.emit(f"{got} = {dialect.op('recv')} {landing} on {MESH_SYMBOL} {dialect.axes_attr} = {group} "
               f"source = [{', '.join(source)}] : ({types}) -> {tile}")
        buffer = _insert(b, buffer, got, target_box[:rank], target_box[rank:], tile, hint)
    return Operand(buffer.name, out)


def _box(transfer: Transfer | None, source_side: bool, rank: int) -> list[int]:
    """A transfer's tile on the sending or receiving side: offsets then sizes (zeros: none)."""
    if transfer is None:
        return [0] * 2 * rank
    box = transfer.source_box if source_side else transfer.target_box
    return [a for a, _ in box] + [e - a for a, e in box]


def _table(b: Body, device: DeviceIndex, rows: list[list[int]], hint: str) -> list[str]:
    """A constant table with one row per device; returns this device's row as SSA indices."""
    width = len(rows[0])
    name = b.name(hint)
    kind = f"tensor<{len(rows)}x{width}xindex>"
    b.emit(f"{name} = arith.constant dense<[{', '.join(int_list(r) for r in rows)}]> : {kind}")
    me = device.linear()
    values = []
    for column in range(width):
        value = b.name(f"{hint}_{column}")
        b.emit(f"{value} = tensor.extract {name}[{me}, {device.const(column)}] : {kind}")
        values.append(value)
    return values


def _cut(b: Body, x: Operand, offsets: list[str], sizes: list[str], tile: str) -> str:
    piece = b.name("tile")
    b.emit(f"{piece} = tensor.extract_slice {x.name}[{', '.join(offsets)}] [{', '.join(sizes)}] "
           f"{int_list([1] * len(offsets))} : {x.type} to {tile}")
    return piece


def _insert(b: Body, buffer: Operand, piece: str, offsets: list[str], sizes: list[str], tile: str, hint: str) -> Operand:
    name = b.name(hint)
    b.emit(f"{name} = tensor.insert_slice {piece} into {buffer.name}[{', '.join(offsets)}] [{', '.join(sizes)}] "
           f"{int_list([1] * len(offsets))} : {tile} into {buffer.type}")
    return Operand(name, buffer.spec)


def _halo_block(step: CollectiveStep, x: Operand, out: Spec, dim: int) -> tuple[int, int, int | str]:
    """Along `dim`: where the block starts in the old and in the new buffer, and its length (the
    smaller side's; a short last shard without a halo is dynamic)."""
    old, new = step.before.halo(dim), step.after.halo(dim)
    if old != (0, 0) and new != (0, 0):
        return old[0], new[0], x.shape[dim] - sum(old)
    return old[0], new[0], (x.sizes if new != (0, 0) else out.sizes)[dim]


def _update_halo(b: Body, dialect: Dialect, mesh: Mesh, step: CollectiveStep, x: Operand, out: Spec,
                 device: DeviceIndex, hint: str) -> Operand:
    rank = len(x.shape)
    blocks = [_halo_block(step, x, out, d) for d in range(rank)]
    ones = int_list([1] * rank)
    shrinks = all(step.after.halo(d)[i] <= step.before.halo(d)[i] for d in range(rank) for i in (0, 1))
    name = b.name(hint)
    if shrinks:  # every cell of the new buffer is already held: no exchange
        offsets = ", ".join(str(old - new) for old, new, _ in blocks)
        b.emit(f"{name} = tensor.extract_slice {x.name}[{offsets}] [{', '.join(str(s) for s in out.sizes)}] {ones} "
               f": {x.type} to {out.type}")
        return Operand(name, out)
    zeros = filled(b, out, 0.0, "halo_buffer")
    split = ", ".join(axes_list(mesh, axes) for axes in step.after.split_axes)
    source_halos, destination_halos = (int_list(step.dims[k]) for k in step_kind(step.kind).attrs)
    if dialect.name == "mesh":
        b.emit(f"{name} = {dialect.op('update_halo')} {x.name} into {zeros.name} on {MESH_SYMBOL} split_axes = [{split}] "
               f"source_halo_sizes = {source_halos} destination_halo_sizes = {destination_halos} : {x.type} -> {out.type}")
        return Operand(name, out)
    tile = tensor_type([size if isinstance(size, int) else "?" for *_, size in blocks], x.dtype)
    sizes = ", ".join(str(size) for *_, size in blocks)
    block = b.name("block")
    b.emit(f"{block} = tensor.extract_slice {x.name}[{', '.join(str(old) for old, _, _ in blocks)}] [{sizes}] {ones} "
           f": {x.type} to {tile}")
    placed = b.name("placed")
    b.emit(f"{placed} = tensor.insert_slice {block} into {zeros.name}[{', '.join(str(new) for _, new, _ in blocks)}] "
           f"[{sizes}] {ones} : {tile} into {out.type}")
    b.emit(f"{name} = {dialect.op('update_halo')} {placed} on {MESH_SYMBOL} split_axes = [{split}] "
           f"halo_sizes = {destination_halos} : {out.type}")
    return Operand(name, out)


# How each kind of `autoshard.resharding.STEP_KINDS` is printed.
STEP_PRINTERS: dict[str, Printer] = {
    "all_gather": _collective,
    "all_slice": _collective,
    "all_to_all": _collective,
    "all_reduce": _collective,
    "reduce_scatter": _collective,
    "permute": _permute,
    "update_halo": _update_halo,
}


def emit_shift(b: Body, dialect: Dialect, mesh: Mesh, mesh_axes: Sequence[str], axis: str, offset: int, x: Operand,
               out: Spec, hint: str) -> Operand:
    """`shift` (rotating) of `x` by `offset` places along `axis` within groups over `mesh_axes`."""
    name = b.name(hint)
    b.emit(f"{name} = {dialect.op('shift')} {x.name} on {MESH_SYMBOL} {dialect.axes_attr} = "
           f"{axes_list(mesh, mesh_axes)} shift_axis = {mesh.axis_index(axis)} offset = {offset} rotate "
           f": {x.type} -> {out.type}")
    return Operand(name, out)


def emit_all_reduce(b: Body, dialect: Dialect, mesh: Mesh, mesh_axes: Sequence[str], x: Operand, kind: str,
                    hint: str) -> Operand:
    """`all_reduce` of `x` with reduction `kind` over `mesh_axes`, outside any resharding step
    (an op's own combine: attention with its key loop split)."""
    name = b.name(hint)
    b.emit(f"{name} = {dialect.op('all_reduce')} {x.name} on {MESH_SYMBOL} {dialect.axes_attr} = "
           f"{axes_list(mesh, mesh_axes)} reduction = {dialect.reduction(kind)} : {x.type} -> {x.type}")
    return Operand(name, x.spec)
