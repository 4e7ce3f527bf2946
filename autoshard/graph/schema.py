"""The graph JSON format `autoshard.graph/v1`: wire models, validation, conversion.

pydantic checks the document's structure; then a semantic pass checks names, shapes against
each op's maps, dtypes, cycles and constraints. Every problem found is reported at once, each
with the JSON pointer of the offending field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, ValidationError

from autoshard.dtypes import DTYPES
from autoshard.encodable import check_encodable, printable
from autoshard.errors import InputError, Problem
from autoshard.graph.layers import layer_problems
from autoshard.graph.model import Constraint, Graph, Op, Tensor
from autoshard.graph.state import STATE_FIELDS, state_problems
from autoshard.mesh import Mesh
from autoshard.ops import OP_KINDS, OpError, OpKind
from autoshard.ops.attributes import attribute_problems
from autoshard.ops.payloads import PAYLOADS, payload_dtype_problem
from autoshard.reductions import REDUCTION_KINDS, REDUCTIONS
from autoshard.sharding import Sharding

FORMAT = "autoshard.graph/v1"


class TensorModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[StrictInt]
    dtype: str
    role: Literal["input", "parameter", "intermediate"] = "intermediate"
    updates: str | None = None  # in place: the input or parameter whose storage this value overwrites
    grad_of: str | None = None  # the parameter this value is the gradient of
    batch_dim: StrictInt | None = None  # the dim of an input that carries the batch
    value: list[StrictBool | StrictInt | StrictFloat] | None = None  # an input's known contents, row-major


class OpModel(BaseModel):
    # Attributes may sit at the top level of the op (as in the format's examples) or in `attrs`.
    model_config = ConfigDict(extra="allow")
    name: str
    kind: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = Field(default_factory=dict)
    module: str = ""  # where an imported op came from in its framework's module tree; not an attribute
    layer: StrictInt | None = Field(default=None, ge=0)  # the repeated layer the op belongs to; not an attribute


class PartialModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal[REDUCTION_KINDS] = "sum"
    axes: list[str]


class ConstraintModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tensor: str
    split_axes: list[list[str]]
    partial: PartialModel | None = None
    required: StrictBool = True


class GraphModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    name: str = "graph"
    tensors: dict[str, TensorModel]
    ops: list[OpModel]
    outputs: list[str] = Field(default_factory=list)
    constraints: list[ConstraintModel] = Field(default_factory=list)
    mesh: str | None = None


def graph_json_schema() -> dict[str, Any]:
    """The document's JSON Schema, self-contained (no `$ref`), with what the validator requires of
    the values too: the format, positive dims, a known dtype and op kind. Names, shapes against
    each op's maps and cycles are checked by `graph_from_json` alone."""
    schema = GraphModel.model_json_schema()
    definitions = schema.pop("$defs")

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].rsplit("/", 1)[1]])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    schema = inline(schema)
    schema["properties"]["format"] = {"const": FORMAT, "title": "Format", "type": "string"}
    tensor = schema["properties"]["tensors"]["additionalProperties"]
    tensor["properties"]["shape"]["items"]["minimum"] = 1
    tensor["properties"]["dtype"]["enum"] = sorted(DTYPES)
    schema["properties"]["ops"]["items"]["properties"]["kind"]["enum"] = sorted(OP_KINDS)
    schema["title"] = "Graph document (autoshard.graph/v1)"
    return schema


def pointer(loc: tuple[Any, ...]) -> str:
    return "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in loc)


def read_json(path: str | Path) -> Any:
    """A JSON document from a file: text in UTF-8, each object's keys distinct."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise InputError(f"cannot read file: {error.strerror}", str(path)) from None
    except UnicodeDecodeError as error:
        raise InputError(f"not UTF-8 text: byte {error.start} is 0x{error.object[error.start]:02x}", str(path)) from None
    return parse_json(text, str(path))


def parse_json(text: str, where: str) -> Any:
    """`text` as JSON, refusing a key repeated in one object (JSON keeps the last silently),
    nesting too deep to walk and strings UTF-8 cannot encode (lone surrogates)."""
    try:
        document = decode_json(text)
    except json.JSONDecodeError as error:
        raise InputError(f"not JSON: {error.msg} at line {error.lineno} column {error.colno}", where) from None
    except RecursionError:
        raise InputError("not a document autoshard reads: JSON nested too deeply", where) from None
    except RepeatedKey as error:
        raise InputError(f"the key {printable(error.args[0])!r} appears twice in one object; JSON would keep only "
                         "the last", where) from None
    check_encodable(document)
    return document


# Longer integer literals are beyond any size, count or index a document can mean (2**128 has 39
# digits; sizes past 2**50 bytes are refused with their own reason); past 4300 digits Python would
# not even convert them.
MAX_INTEGER_DIGITS = 40


class HugeInteger:
    """Stands in for an integer literal of more than MAX_INTEGER_DIGITS digits while a document is
    decoded, so that the reader can name where it was."""

    __slots__ = ("digits",)

    def __init__(self, digits: int):
        self.digits = digits


def decode_json(text: str | bytes) -> Any:
    """JSON text as Python values: raises `RepeatedKey` for a key repeated in one object, and an
    InputError naming by pointer every integer literal too long to mean anything."""
    huge: list[HugeInteger] = []

    def bounded_int(literal: str) -> int | HugeInteger:
        digits = len(literal) - literal.startswith("-")
        if digits <= MAX_INTEGER_DIGITS:
            return int(literal)
        huge.append(HugeInteger(digits))
        return huge[-1]

    document = json.loads(text, object_pairs_hook=distinct_keys, parse_int=bounded_int)
    if huge:
        raise InputError(_huge_integer_problems(document, ""))
    return document


def _huge_integer_problems(value: Any, where: str) -> list[Problem]:
    if isinstance(value, HugeInteger):
        return [Problem(where or "/", f"an integer of {value.digits} digits is beyond any size autoshard reads "
                                      f"(at most {MAX_INTEGER_DIGITS} digits)")]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [p for key, item in items for p in _huge_integer_problems(item, where + pointer((key,)))]


class RepeatedKey(Exception):
    """A JSON object names one key twice; `args[0]` is the key."""


def distinct_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook` that raises `RepeatedKey` instead of keeping the last value."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        raise RepeatedKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return found


def load_graph(source: str | Path | dict[str, Any], mesh: Mesh | None = None) -> Graph:
    """Read and validate a graph document (a path or the parsed JSON)."""
    document = source if isinstance(source, dict) else read_json(source)
    return graph_from_json(document, mesh)


def graph_from_json(document: Any, mesh: Mesh | None = None) -> Graph:
    if not isinstance(document, dict):
        raise InputError(f"a graph document is a JSON object, got {type(document).__name__}", "/")
    if document.get("format") != FORMAT:
        raise InputError(f"expected \"{FORMAT}\", got {document.get('format')!r}", "/format")
    check_encodable(document)
    try:
        model = GraphModel.model_validate(document)
    except ValidationError as error:
        raise InputError([Problem(pointer(e["loc"]), e["msg"]) for e in error.errors()]) from None
    if mesh is None and model.mesh:
        mesh = Mesh.parse(model.mesh)
    return _build(model, mesh)


# Sizes beyond any model, kept well inside the 64-bit integers that byte counts and memory sums use.
MAX_TENSOR_BYTES = 2 ** 50
MAX_GRAPH_BYTES = 2 ** 56


def _build(model: GraphModel, mesh: Mesh | None) -> Graph:
    problems: list[Problem] = []
    tensors: dict[str, Tensor] = {}
    total_bytes = 0
    names = [(f"/tensors/{n}", "tensor", n) for n in model.tensors] + [(f"/ops/{i}/name", "op", m.name)
                                                                       for i, m in enumerate(model.ops)]
    for where, what, name in names:
        if not name or any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
            problems.append(Problem(where, f"{what} name {name!r} must be non-empty and free of control characters "
                                           f"(they cannot be carried into the IR)"))
    for name, t in model.tensors.items():
        where = f"/tensors/{name}"
        if t.dtype not in DTYPES:
            problems.append(Problem(f"{where}/dtype", f"tensor {name!r}: unknown dtype {t.dtype!r}; expected one of {sorted(DTYPES)}"))
        for j, size in enumerate(t.shape):
            if size < 1:
                problems.append(Problem(f"{where}/shape/{j}", f"tensor {name!r}: dims must be positive integers, got {size}"))
        if t.dtype in DTYPES and all(size >= 1 for size in t.shape):
            held = math.prod(t.shape) * DTYPES[t.dtype].itemsize
            total_bytes += held
            if held > MAX_TENSOR_BYTES:
                problems.append(Problem(f"{where}/shape", f"tensor {name!r} holds {held:.3g} bytes, over the limit of "
                                                          f"2**50 (1 PiB) per tensor"))
        if t.value is not None:
            if t.role != "input":
                problems.append(Problem(f"{where}/value", f"tensor {name!r}: only an input has known contents"))
            if len(t.value) != math.prod(t.shape):
                problems.append(Problem(f"{where}/value", f"tensor {name!r}: {len(t.value)} values for shape "
                                                          f"{list(t.shape)}, which holds {math.prod(t.shape)}"))
            if not all(math.isfinite(v) for v in t.value):
                problems.append(Problem(f"{where}/value", f"tensor {name!r}: values must be finite"))
        tensors[name] = Tensor(name, tuple(t.shape), t.dtype, t.role, t.updates, t.grad_of, t.batch_dim,
                               tuple(t.value) if t.value is not None else None)
    if total_bytes > MAX_GRAPH_BYTES and not problems:
        problems.append(Problem("/tensors", f"the tensors hold {total_bytes:.3g} bytes together, over the limit of "
                                            f"2**56 (64 PiB)"))

    ops: list[Op] = []
    producer: dict[str, str] = {}
    names: set[str] = set()
    for i, m in enumerate(model.ops):
        op = _build_op(i, m, tensors, producer, names, problems)
        if op is not None:
            ops.append(op)

    for name, t in tensors.items():
        if t.role == "intermediate" and name not in producer:
            problems.append(Problem(f"/tensors/{name}/role", f"tensor {name!r} is produced by no op; give it role \"input\" or \"parameter\""))
    for j, name in enumerate(model.outputs):
        if name not in tensors:
            problems.append(Problem(f"/outputs/{j}", f"unknown tensor {name!r}"))
    constraints = _constraints(model, tensors, mesh, problems)
    outputs = tuple(model.outputs) or tuple(n for n in producer if not any(n in op.inputs for op in ops))
    problems.extend(_pin_problems(model, tensors, outputs))
    problems.extend(state_problems(tensors, producer, outputs))
    if not problems:
        _check_acyclic(ops, producer, problems, tensors)
    if problems:
        raise InputError(problems)
    graph = Graph(model.name, tensors, tuple(ops), outputs, tuple(constraints), model.mesh)
    problems.extend(layer_problems(graph))
    if problems:
        raise InputError(problems)
    return graph


def _build_op(i: int, m: OpModel, tensors: dict[str, Tensor], producer: dict[str, str], names: set[str],
              problems: list[Problem]) -> Op | None:
    where = f"/ops/{i}"
    label = f"op {m.name!r}"
    count = len(problems)
    if m.name in names:
        problems.append(Problem(f"{where}/name", f"{label}: an op of this name already exists"))
    names.add(m.name)
    for j, t in enumerate(m.inputs):
        if t not in tensors:
            problems.append(Problem(f"{where}/inputs/{j}", f"{label}: unknown tensor {t!r}"))
    for j, t in enumerate(m.outputs):
        if t not in tensors:
            problems.append(Problem(f"{where}/outputs/{j}", f"{label}: unknown tensor {t!r}"))
        elif t in producer:
            problems.append(Problem(f"{where}/outputs/{j}", f"{label}: tensor {t!r} is already produced by op {producer[t]!r}"))
        elif tensors[t].role != "intermediate":
            problems.append(Problem(f"{where}/outputs/{j}", f"{label}: tensor {t!r} has role {tensors[t].role!r}, so no op may produce it"))
        else:
            producer[t] = m.name
    kind = OP_KINDS.get(m.kind)
    if kind is None:
        problems.append(Problem(f"{where}/kind", f"{label}: unknown op kind {m.kind!r}; expected one of {sorted(OP_KINDS)}"))
        return None
    attrs = dict(m.attrs) | dict(m.model_extra or {})
    for a in m.attrs.keys() & (m.model_extra or {}).keys():
        problems.append(Problem(f"{where}/attrs/{a}", f"{label}: attribute {a!r} is given both here and at the top "
                                                      f"level of the op; give it once"))
    for a in attrs:
        if a not in kind.attrs:
            problems.append(Problem(f"{where}/{a}", f"{label}: {m.kind} takes no attribute {a!r}" + (f"; it takes {list(kind.attrs)}" if kind.attrs else "")))
    for a, message in attribute_problems(attrs).items():
        problems.append(Problem(f"{where}/attrs/{a}" if a in m.attrs else f"{where}/{a}", f"{label}: {message}"))
    low, high = kind.num_inputs
    if len(m.inputs) < low or (high is not None and len(m.inputs) > high):
        expected = str(low) if low == high else f"{low} to {high}" if high is not None else f"at least {low}"
        problems.append(Problem(f"{where}/inputs", f"{label}: {m.kind} takes {expected} input(s), got {len(m.inputs)}"))
    if len(problems) > count:
        return None
    shapes = [tensors[t].shape for t in m.inputs]
    if kind.reads_output_shapes:
        shapes += [tensors[t].shape for t in m.outputs]
    try:
        nest = kind.loops(shapes, attrs)
        out_dtypes = kind.out_dtypes([tensors[t].dtype for t in m.inputs], attrs)
    except OpError as error:
        problems.append(Problem(f"{where}/{error.field}" if error.field else where, f"{label} ({m.kind}): {error}"))
        return None
    if len(nest.output_maps) != len(m.outputs):
        problems.append(Problem(f"{where}/outputs", f"{label}: {m.kind} produces {len(nest.output_maps)} output(s), got {len(m.outputs)}"))
        return None
    problems.extend(_dtype_problems(kind, attrs, m, tensors, where, label))
    for j, (t, shape, dtype) in enumerate(zip(m.outputs, nest.output_shapes(), out_dtypes)):
        declared = tensors[t]
        if declared.shape != shape:
            problems.append(Problem(f"/tensors/{t}/shape", f"{label} ({m.kind}) produces shape {list(shape)} for {t!r}, but it is declared {list(declared.shape)}"))
        if dtype is not None and declared.dtype != dtype:
            problems.append(Problem(f"/tensors/{t}/dtype", f"{label} ({m.kind}) produces dtype {dtype} for {t!r}, but it is declared {declared.dtype}"))
    return Op(m.name, m.kind, tuple(m.inputs), tuple(m.outputs), attrs, nest, m.module, m.layer)


def _dtype_problems(kind: OpKind, attrs: dict[str, Any], m: OpModel, tensors: dict[str, Tensor], where: str,
                    label: str) -> list[Problem]:
    """The op computes on the dtype the lowering gives it, its first input's (or, with no inputs,
    its result's): a float for a float-only kind, one its payload has a meaning on."""
    field, name = (f"{where}/inputs/0", m.inputs[0]) if m.inputs else (f"{where}/outputs/0", m.outputs[0])
    dtype = tensors[name].dtype
    payload = kind.payload_of(attrs)
    if kind.float_only and not DTYPES[dtype].is_float:
        problem = f"{m.kind} computes on floating-point values only"
    elif payload in PAYLOADS:
        problem = payload_dtype_problem(payload, dtype)
    else:
        problem = None
    return [Problem(field, f"{label} ({m.kind}) reads {name!r} of dtype {dtype}: {problem}")] if problem else []


def _constraints(model: GraphModel, tensors: dict[str, Tensor], mesh: Mesh | None,
                 problems: list[Problem]) -> list[Constraint]:
    out = []
    required: dict[str, tuple[int, Sharding]] = {}  # tensor -> its first required sharding
    for i, c in enumerate(model.constraints):
        where = f"/constraints/{i}"
        if c.tensor not in tensors:
            problems.append(Problem(f"{where}/tensor", f"unknown tensor {c.tensor!r}"))
            continue
        partial = c.partial
        sharding = Sharding(tuple(tuple(a) for a in c.split_axes), tuple(partial.axes) if partial else (),
                            partial.kind if partial else "sum")
        problems.extend(_sharding_problems(sharding, tensors[c.tensor].shape, mesh, f"{where}/split_axes", c.tensor))
        if c.required:
            first = required.setdefault(c.tensor, (i, sharding))
            if first[1] != sharding:
                problems.append(Problem(where, f"tensor {c.tensor!r} is required as {sharding} here and as {first[1]} "
                                               f"by /constraints/{first[0]}; a tensor has one required sharding"))
        out.append(Constraint(c.tensor, sharding, c.required))
    return out


def _pin_problems(model: GraphModel, tensors: dict[str, Tensor], outputs: tuple[str, ...]) -> list[Problem]:
    """Partial pins a tensor cannot hold: an input or parameter is stored, whole or split, never
    partial; a graph output is resharded to its pin from the value as produced, and resharding
    can reduce a partial value but never make one, except an idempotent kind's (max, min: a
    whole value on every device already is one)."""
    problems = []
    for i, c in enumerate(model.constraints):
        if c.partial is None or c.tensor not in tensors:
            continue
        where, role = f"/constraints/{i}/partial", tensors[c.tensor].role
        if role != "intermediate":
            problems.append(Problem(where, f"{role} {c.tensor!r} is stored whole or split on each device, never "
                                           f"partial; pin it without `partial`"))
        elif c.tensor in outputs and not REDUCTIONS[c.partial.kind].idempotent:
            problems.append(Problem(where, f"graph output {c.tensor!r} cannot be pinned {c.partial.kind}-partial: "
                                           f"it is resharded to its pin from the value as produced, and resharding "
                                           f"reduces partial values but never makes one"))
    return problems


def _sharding_problems(sharding: Sharding, shape: tuple[int, ...], mesh: Mesh | None, where: str,
                       tensor: str) -> list[Problem]:
    problems = []
    if len(sharding.split_axes) > len(shape):
        problems.append(Problem(where, f"tensor {tensor!r} has rank {len(shape)} but the sharding names {len(sharding.split_axes)} dims"))
    used = sharding.used_axes()
    for axis in dict.fromkeys(a for a in used if used.count(a) > 1):
        problems.append(Problem(where, f"tensor {tensor!r}: mesh axis {axis!r} is used twice in one sharding"))
    if mesh is not None:
        for axis in dict.fromkeys(used):
            if axis not in mesh.axis_names:
                problems.append(Problem(where, f"tensor {tensor!r}: unknown mesh axis {axis!r}; the mesh has {list(mesh.axis_names)}"))
    return problems


def _check_acyclic(ops: list[Op], producer: dict[str, str], problems: list[Problem],
                   tensors: dict[str, Tensor]) -> None:
    """Name one cycle, if the ops form any: peel off ops whose inputs are all made (Kahn); an op
    left over reads a left-over op's tensor, so walking back through those must repeat. An op
    writing a value in place comes after the other readers of the value it overwrites."""
    makers = {op.name: [producer[t] for t in dict.fromkeys(op.inputs) if t in producer] for op in ops}
    readers_of: dict[str, list[str]] = {}
    for op in ops:
        for t in dict.fromkeys(op.inputs):
            readers_of.setdefault(t, []).append(op.name)
    for t, maker in producer.items():
        old = tensors[t].updates
        if old is not None:
            makers[maker] = list(dict.fromkeys(makers[maker] + [r for r in readers_of.get(old, ()) if r != maker]))
    waiting = {name: len(found) for name, found in makers.items()}
    readers: dict[str, list[str]] = {}
    for name, found in makers.items():
        for maker in found:
            readers.setdefault(maker, []).append(name)
    ready = [name for name, count in waiting.items() if count == 0]
    while ready:
        for reader in readers.get(ready.pop(), ()):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                ready.append(reader)
    left = [name for name, count in waiting.items() if count > 0]
    if not left:
        return
    path, seen, name = [], {}, left[0]
    while name not in seen:
        seen[name] = len(path)
        path.append(name)
        name = next(maker for maker in makers[name] if waiting[maker] > 0)
    cycle = path[seen[name]:][::-1]  # walked from readers to makers; print in data-flow order
    problems.append(Problem("/ops", f"the ops form a cycle: {' -> '.join(cycle + [cycle[0]])}"))


def graph_to_json(graph: Graph) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": FORMAT, "name": graph.name,
        "tensors": {t.name: {"shape": list(t.shape), "dtype": t.dtype, **({"role": t.role} if t.role != "intermediate" else {}),
                             **{key: getattr(t, key) for key in STATE_FIELDS if getattr(t, key) is not None},
                             **({"value": list(t.value)} if t.value is not None else {})}
                    for t in graph.tensors.values()},
        "ops": [{"name": op.name, "kind": op.kind, "inputs": list(op.inputs), "outputs": list(op.outputs), **_plain(op.attrs),
                 **({"module": op.module} if op.module else {}), **({"layer": op.layer} if op.layer is not None else {})}
                for op in graph.ops],
        "outputs": list(graph.outputs),
    }
    if graph.constraints:
        doc["constraints"] = [{"tensor": c.tensor, **c.sharding.to_json(), "required": c.required} for c in graph.constraints]
    if graph.mesh_hint:
        doc["mesh"] = graph.mesh_hint
    return doc


def _plain(attrs: Any) -> Any:
    if isinstance(attrs, dict) or hasattr(attrs, "items"):
        return {k: _plain(v) for k, v in attrs.items()}
    if isinstance(attrs, (list, tuple)):
        return [_plain(v) for v in attrs]
    return attrs
