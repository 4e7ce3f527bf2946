"""Building blocks of emitted compute: typed operands, `tensor.empty`, `linalg.fill`, and
`linalg.generic` with its indexing maps, iterator types and a scalar region."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from autoshard.affine import AffineMap
from autoshard.mlir.scalar import constant, identity_value
from autoshard.mlir.text import Body, elem_type, tensor_type


Dim = int | str  # a static size, or the SSA name of a size that varies by device ("?" if never needed)


@dataclass(frozen=True, slots=True)
class Spec:
    """A tensor's type: its largest (static) shape and, per dim, the size each device has."""

    shape: tuple[int, ...]
    dtype: str
    dims: tuple[Dim, ...] | None = None  # None: every dim static

    @property
    def sizes(self) -> tuple[Dim, ...]:
        return self.dims if self.dims is not None else self.shape

    @property
    def type(self) -> str:
        return tensor_type(["?" if isinstance(d, str) else d for d in self.sizes], self.dtype)

    def take(self, dims: Sequence[int]) -> "Spec":
        """The spec of a tensor indexed by a subset (or reordering) of these dims."""
        return Spec(tuple(self.shape[d] for d in dims), self.dtype, tuple(self.sizes[d] for d in dims))


@dataclass(frozen=True, slots=True)
class Operand:
    """An SSA tensor value and its spec."""

    name: str
    spec: Spec

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> str:
        return self.spec.dtype

    @property
    def sizes(self) -> tuple[Dim, ...]:
        return self.spec.sizes

    @property
    def type(self) -> str:
        return self.spec.type


def empty(b: Body, spec: Spec, hint: str = "empty") -> Operand:
    dynamic = [d for d in spec.sizes if isinstance(d, str)]
    assert "?" not in dynamic, f"tensor.empty of {spec} needs every dynamic size"
    name = b.name(hint)
    b.emit(f"{name} = tensor.empty({', '.join(dynamic)}) : {spec.type}")
    return Operand(name, spec)


def filled(b: Body, spec: Spec, value: float, hint: str = "init") -> Operand:
    """A tensor of `spec` holding `value` everywhere (a reduction's accumulator)."""
    e = empty(b, spec)
    scalar = constant(b, value, spec.dtype)
    name = b.name(hint)
    b.emit(f"{name} = linalg.fill ins({scalar} : {elem_type(spec.dtype)}) outs({e.name} : {e.type}) -> {e.type}")
    return Operand(name, spec)


def reduction_init(b: Body, spec: Spec, kind: str) -> Operand:
    return filled(b, spec, identity_value(kind, spec.dtype))


def ins_outs(inputs: Sequence[Operand], outputs: Sequence[Operand]) -> str:
    text = ""
    if inputs:
        text += f"ins({', '.join(o.name for o in inputs)} : {', '.join(o.type for o in inputs)}) "
    return text + f"outs({', '.join(o.name for o in outputs)} : {', '.join(o.type for o in outputs)})"


Region = Callable[[Body, list[str], str], str]  # (body, input scalars, accumulator) -> yielded scalar


def generic(b: Body, maps: Sequence[AffineMap], iterators: Sequence[str], inputs: Sequence[Operand],
            init: Operand, region: Region, hint: str = "generic") -> Operand:
    """`linalg.generic` over `inputs` writing `init` (maps: inputs then output; iterators are
    linalg's `parallel`/`reduction`)."""
    result = b.name(hint)
    map_text = ", ".join(f"affine_map<{m}>" for m in maps)
    iter_text = ", ".join(f'"{t}"' for t in iterators)
    b.emit(f"{result} = linalg.generic {{indexing_maps = [{map_text}], iterator_types = [{iter_text}]}} "
           f"{ins_outs(inputs, [init])} {{")
    args = [b.name("in") for _ in inputs]
    acc = b.name("acc")
    params = [f"{a}: {elem_type(o.dtype)}" for a, o in zip(args, inputs)] + [f"{acc}: {elem_type(init.dtype)}"]
    b.emit(f"^bb0({', '.join(params)}):")
    b.depth += 1
    value = region(b, args, acc)
    b.emit(f"linalg.yield {value} : {elem_type(init.dtype)}")
    b.depth -= 1
    b.emit(f"}} -> {init.type}")
    return Operand(result, init.spec)


def linalg_index(b: Body, loop: int, offset: str | None) -> str:
    """The loop's index inside a linalg region, made global by adding the block's `offset`."""
    name = b.name(f"i{loop}")
    b.emit(f"{name} = linalg.index {loop} : index")
    if offset is None:
        return name
    shifted = b.name(f"g{loop}")
    b.emit(f"{shifted} = arith.addi {name}, {offset} : index")
    return shifted


def layout_position(b: Body, index: str, length: int, balanced: int | None) -> str:
    """The sequence position of global stored `index` along an axis of `length` in the balanced
    causal layout over `balanced` devices (`ops.nn.layout_order`); the index itself otherwise."""
    if not balanced or balanced == 1:
        return index
    chunk, last = length // (2 * balanced), 2 * balanced - 1

    def value(op: str, *args: str, hint: str = "lay") -> str:
        name = b.name(hint)
        b.emit(f"{name} = {op} {', '.join(args)} : index")
        return name

    def const(n: int) -> str:
        return value("arith.constant", str(n), hint=f"c{n}_")
    slot = value("arith.divui", index, const(chunk), hint="slot")
    within = value("arith.remui", index, const(chunk), hint="within")
    half = value("arith.divui", slot, const(2), hint="half")
    odd = b.name("odd")
    b.emit(f"{odd} = arith.cmpi eq, {value('arith.remui', slot, const(2))}, {const(1)} : index")
    # an even slot holds chunk slot / 2, an odd one chunk 2n - 1 - slot / 2
    late = value("arith.subi", const(last), half, hint="late")
    chosen = b.name("chunk")
    b.emit(f"{chosen} = arith.select {odd}, {late}, {half} : index")
    return value("arith.addi", value("arith.muli", chosen, const(chunk)), within, hint="pos")
