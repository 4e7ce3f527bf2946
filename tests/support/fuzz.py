"""Hypothesis strategies for what users hand autoshard: graphs, meshes and plans, valid and
broken. A valid graph is a chain of 2-D ops whose shapes agree; a broken one is a valid one with
one thing wrong (a missing field, a bad dim, an unknown name, a cycle, ...) or any JSON at all."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

AXES = ("dp", "tp", "pp")
DIMS = st.sampled_from([1, 2, 3, 4, 6, 8, 16])
UNARY = ("relu", "gelu", "tanh", "exp", "neg", "softmax")
BINARY = ("add", "mul", "sub")
ODD_MESHES = ["", "dp", "dp=0", "dp=-2", "dp=2,dp=2", "dp=2,,tp=2", "dp=1e3", "d p=2", "dp=2.5",
              "dp=1000000000000", "dp=65536,tp=65536", "dp=1048577", "dp=2,tp=\n2", "=2"]
ODD_VALUES = st.sampled_from([0, -1, 2.5, 10 ** 30, 2 ** 63, "8", None, [], {}, True, "x\ny", "\u0000"])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)


@st.composite
def meshes(draw: st.DrawFn) -> str:
    """A valid mesh text of 1 to 3 axes of 1, 2 or 4 devices (any count of whole 8-GPU nodes or
    less than one, as the default topology needs)."""
    names = draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=3, unique=True))
    return ",".join(f"{name}={draw(st.sampled_from([1, 2, 4]))}" for name in names)


def any_mesh() -> st.SearchStrategy[str]:
    """Mostly valid meshes (so that graphs get past them), else malformed or huge ones."""
    return st.one_of(meshes(), meshes(), meshes(), st.sampled_from(ODD_MESHES), st.text(max_size=10))


@st.composite
def graphs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid graph: an input, then 1 to 5 ops each reading the last value (and a parameter)."""
    dtype = draw(st.sampled_from(["f32", "bf16"]))
    shape = [draw(DIMS), draw(DIMS)]
    tensors: dict[str, Any] = {"x": {"shape": shape, "dtype": dtype, "role": "input"}}
    ops: list[dict[str, Any]] = []
    current = "x"
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(("matmul", "transpose") + UNARY + BINARY))
        op: dict[str, Any] = {"name": f"op{i}", "kind": kind, "inputs": [current], "outputs": [f"t{i}"]}
        if kind == "matmul":
            shape = [shape[0], draw(DIMS)]
            tensors[f"w{i}"] = {"shape": [tensors[current]["shape"][1], shape[1]], "dtype": dtype, "role": "parameter"}
            op["inputs"].append(f"w{i}")
        elif kind in BINARY:
            tensors[f"b{i}"] = {"shape": list(shape), "dtype": dtype, "role": "parameter"}
            op["inputs"].append(f"b{i}")
        elif kind == "transpose":
            shape = shape[::-1]
            op["perm"] = [1, 0]
        tensors[f"t{i}"] = {"shape": list(shape), "dtype": dtype}
        ops.append(op)
        current = f"t{i}"
    document = {"format": "autoshard.graph/v1", "name": "fuzz", "tensors": tensors, "ops": ops, "outputs": [current]}
    if draw(st.integers(0, 3)) == 3:  # the rare case is not the simplest draw
        tensor = draw(st.sampled_from(sorted(tensors)))
        document["constraints"] = [{"tensor": tensor, "split_axes": draw(split_axes(len(tensors[tensor]["shape"]))),
                                    "required": draw(st.booleans())}]
    return document


def split_axes(rank: int) -> st.SearchStrategy[list[list[str]]]:
    """Mesh axes per dim: mostly known axes, sometimes unknown or repeated ones."""
    axis = st.sampled_from(AXES + ("nope",))
    return st.lists(st.lists(axis, max_size=2), min_size=rank, max_size=rank)


def _break(document: dict[str, Any], how: str, value: Any, pick: int) -> Any:
    broken = copy.deepcopy(document)
    names = sorted(broken["tensors"])
    tensor = broken["tensors"][names[pick % len(names)]]
    op = broken["ops"][pick % len(broken["ops"])]
    if how == "drop":
        del broken[("format", "tensors", "ops")[pick % 3]]
    elif how == "dim":
        tensor["shape"][pick % len(tensor["shape"])] = value
    elif how == "shape":
        tensor["shape"] = value
    elif how == "rank":
        tensor["shape"] = tensor["shape"] + [2]
    elif how == "dtype":
        tensor["dtype"] = value
    elif how == "kind":
        op["kind"] = value if isinstance(value, str) else "matmull"
    elif how == "unknown_input":
        op["inputs"][0] = "nowhere"
    elif how == "name":
        op["name"] = f"op\n{pick}" if pick % 2 else value
    elif how == "cycle":
        broken["ops"][0]["inputs"][0] = broken["ops"][-1]["outputs"][0]
    elif how == "twice":
        broken["ops"].append(copy.deepcopy(op))
    elif how == "attr":
        op["perm"] = value
    elif how == "constraint":
        broken["constraints"] = [{"tensor": names[0], "split_axes": value}]
    elif how == "conflict":
        broken["constraints"] = [{"tensor": names[0], "split_axes": [["dp"]] + [[]] * (len(tensor["shape"]) - 1)},
                                 {"tensor": names[0], "split_axes": [[]] * len(tensor["shape"])}]
    elif how == "format":
        broken["format"] = value
    return broken


BREAKS = ("drop", "dim", "shape", "rank", "dtype", "kind", "unknown_input", "name", "cycle", "twice", "attr",
          "constraint", "conflict", "format")


@st.composite
def broken_graphs(draw: st.DrawFn) -> Any:
    """A valid graph with one thing wrong, or any JSON value."""
    if draw(st.integers(0, 9)) == 9:
        return draw(JSON)
    return _break(draw(graphs()), draw(st.sampled_from(BREAKS)), draw(ODD_VALUES), draw(st.integers(0, 20)))


def any_graph() -> st.SearchStrategy[Any]:
    """Two valid graphs for each broken one."""
    return st.one_of(graphs(), graphs(), broken_graphs())


@st.composite
def shardings(draw: st.DrawFn, rank: int, axes: list[str]) -> list[list[str]]:
    """Mesh axes per dim, each axis at most once; one in five draws from any axis names at all."""
    if draw(st.integers(0, 4)) == 4:
        return draw(split_axes(rank))
    unused = list(axes)
    split: list[list[str]] = []
    for _ in range(rank):
        taken = draw(st.lists(st.sampled_from(unused), max_size=1, unique=True)) if unused else []
        unused = [axis for axis in unused if axis not in taken]
        split.append(taken)
    return split


@st.composite
def plans(draw: st.DrawFn, document: Any, axes: list[str] | None = None) -> Any:
    """A plan for `document` on a mesh of `axes`: shardings of its tensors and/or options of its
    ops, right or wrong."""
    axes = list(AXES) if axes is None else axes
    if not (isinstance(document, dict) and isinstance(document.get("tensors"), dict)
            and isinstance(document.get("ops"), list)) or draw(st.integers(0, 9)) == 9:
        return draw(JSON)
    plan: dict[str, Any] = {"tensors": {}, "ops": {}}
    for name, tensor in document["tensors"].items():
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if isinstance(shape, list) and draw(st.booleans()):
            plan["tensors"][name] = draw(shardings(len(shape), axes))
    for op in document["ops"]:
        if isinstance(op, dict) and isinstance(op.get("name"), str) and draw(st.integers(0, 3)) == 3:
            plan["ops"][op["name"]] = {"option": draw(st.lists(st.lists(st.sampled_from(AXES), max_size=1),
                                                                max_size=3))}
    if draw(st.integers(0, 5)) == 5:
        plan["mesh"] = {"axes": [{"name": "dp", "size": draw(st.integers(-1, 8))}]}
    return plan
