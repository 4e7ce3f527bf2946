"""Hypothesis strategies for what users hand autoshard: graphs, meshes and plans, valid and
broken. A valid graph is a chain of 2-D ops whose shapes agree; a broken one is a valid one with
one thing wrong (a missing field, a bad dim, an unknown name, a cycle, ...) or any JSON at all.
A hand-edited plan is a whole valid plan document with one edit a user might make, paired with
the JSON pointers an answer must name; numbers are also spelled in other scripts' digits and
names hold lone surrogates."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

from autoshard.encodable import printable

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
def meshes(draw: st.DrawFn, sizes: tuple[int, ...] = (1, 2, 4)) -> str:
    """A valid mesh text of 1 to 3 axes of 1, 2 or 4 devices, or of `sizes` (any count of whole
    8-GPU nodes or less than one, as the default topology needs)."""
    names = draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=3, unique=True))
    return ",".join(f"{name}={draw(st.sampled_from(sizes))}" for name in names)


def any_mesh() -> st.SearchStrategy[str]:
    """Mostly valid meshes (so that graphs get past them), else malformed or huge ones."""
    return st.one_of(meshes(), meshes(), meshes(), st.sampled_from(ODD_MESHES), st.text(max_size=10))


@st.composite
def graphs(draw: st.DrawFn, dims: st.SearchStrategy[int] = DIMS) -> dict[str, Any]:
    """A valid graph: an input, then 1 to 5 ops each reading the last value (and a parameter),
    every dim drawn from `dims`."""
    dtype = draw(st.sampled_from(["f32", "bf16"]))
    shape = [draw(dims), draw(dims)]
    tensors: dict[str, Any] = {"x": {"shape": shape, "dtype": dtype, "role": "input"}}
    ops: list[dict[str, Any]] = []
    current = "x"
    for i in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(("matmul", "transpose") + UNARY + BINARY))
        op: dict[str, Any] = {"name": f"op{i}", "kind": kind, "inputs": [current], "outputs": [f"t{i}"]}
        if kind == "matmul":
            shape = [shape[0], draw(dims)]
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
def op_options(draw: st.DrawFn, document: dict[str, Any], axes: list[str]) -> dict[str, Any]:
    """A plan giving every op of a `graphs()` document an option: each loop split over one mesh
    axis or none, no axis twice (the rest of the plan is derived)."""
    options = {}
    for op in document["ops"]:
        loops = 3 if op["kind"] == "matmul" else 2
        unused, option = list(axes), []
        for _ in range(loops):
            taken = draw(st.lists(st.sampled_from(unused), max_size=1)) if unused else []
            unused = [axis for axis in unused if axis not in taken]
            option.append(taken)
        options[op["name"]] = {"option": option}
    return {"ops": options}


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


# A stand-in for an integer literal far past any size (and Python's 4300-digit int-string limit):
# `json_text` writes it as 5,000 nines.
HUGE = "\u0000huge integer"
HUGE_DIGITS = 5000


def json_text(value: Any) -> str:
    """`value` as JSON text, each HUGE written as an integer literal of HUGE_DIGITS digits."""
    return json.dumps(value).replace(json.dumps(HUGE), "9" * HUGE_DIGITS)


def _pointer(*keys: Any) -> str:
    """The JSON pointer of `keys`, as a problem names it (a lone surrogate escaped)."""
    return "".join("/" + printable(str(key)).replace("~", "~0").replace("/", "~1") for key in keys)


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every value in a JSON document, the root's first."""
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    return [path] + [p for key, child in children for p in _paths(child, path + (key,))]


LONE_SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
KINDS = ("matmul", "transpose", "relu", "gelu", "softmax", "add", "attention", "matmull")
RESHARDING_EDITS = ("nonsense steps", "wrong target", "wrong source", "wrong consumer")
HAND_EDITS = ("drop an op", "drop a tensor", "misspell a tensor", "null tensors", "change an op kind", "drop format",
              "wrong format", "larger mesh", "unknown key", "huge integer") + RESHARDING_EDITS


@st.composite
def hand_edits(draw: st.DrawFn, document: dict[str, Any], how: str) -> tuple[dict[str, Any], list[str]]:
    """`document`, a whole plan that fits its graph and mesh, with one hand edit of the class
    `how` (one of HAND_EDITS; those of RESHARDING_EDITS need a document with reshardings); and
    the JSON pointers of the fields an answer must name (each, or a field under it). A HUGE value
    must be written with `json_text`."""
    edited = copy.deepcopy(document)
    reshardings = edited.get("reshardings") or []
    op = draw(st.sampled_from(sorted(edited["ops"])))
    tensor = draw(st.sampled_from(sorted(edited["tensors"])))
    if how == "drop an op":
        del edited["ops"][op]
        return edited, [_pointer("ops", op)]
    if how == "drop a tensor":
        del edited["tensors"][tensor]
        return edited, [_pointer("tensors", tensor)]
    if how == "misspell a tensor":
        misspelled = draw(st.sampled_from([tensor.upper() + "_", tensor + "\u00e9", tensor + "s"])
                          | LONE_SURROGATES.map(lambda c: tensor + c))
        edited["tensors"][misspelled] = edited["tensors"].pop(tensor)
        if any(0xD800 <= ord(c) <= 0xDFFF for c in misspelled):  # refused as it is read, before it is looked up
            return edited, [_pointer("tensors", misspelled)]
        return edited, [_pointer("tensors", misspelled), _pointer("tensors", tensor)]
    if how == "null tensors":
        edited["tensors"] = None
        return edited, ["/tensors"]
    if how == "change an op kind":
        edited["ops"][op]["kind"] = draw(st.sampled_from([k for k in KINDS if k != edited["ops"][op]["kind"]]))
        return edited, [_pointer("ops", op, "kind")]
    if how == "drop format":
        del edited["format"]
        return edited, ["/format"]
    if how == "wrong format":
        edited["format"] = draw(st.sampled_from(["autoshard.plan/v2", "autoshard.graph/v1", "", None, 1]))
        return edited, ["/format"]
    if how == "larger mesh":
        axes = edited["mesh"]["axes"]
        if draw(st.booleans()):
            axes[draw(st.integers(0, len(axes) - 1))]["size"] *= 2
        else:
            axes.append({"name": "ep", "size": 2})
        return edited, ["/mesh"]
    if how == "unknown key":
        entry, where = draw(st.sampled_from([(edited, ()), (edited["ops"][op], ("ops", op)),
                                             (edited["tensors"][tensor], ("tensors", tensor))]
                                            + [(r, ("reshardings", i)) for i, r in enumerate(reshardings)]))
        key = draw(st.sampled_from(["optoin", "split_axis", "Format", "notes", "halo"]))
        entry[key] = draw(ODD_VALUES)
        return edited, [_pointer(*where, key)]
    if how == "huge integer":
        path = draw(st.sampled_from(_paths(edited)[1:]))
        node = edited
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = HUGE
        return edited, [_pointer(*path)]
    i = draw(st.integers(0, len(reshardings) - 1))
    resharding = reshardings[i]
    if how == "nonsense steps":
        steps = resharding["steps"]
        nonsense = draw(st.sampled_from(["all_reduce", None, "[]", "teleport", "no axis", "null step"]
                                        + (["reversed"] if len(steps) > 1 else [])))
        if nonsense in ("all_reduce", None):
            resharding["steps"] = nonsense
            return edited, [_pointer("reshardings", i, "steps")]
        if nonsense == "[]":
            resharding["steps"] = []
            return edited, [_pointer("reshardings", i)]
        if nonsense == "teleport":
            steps[0]["kind"] = "teleport"
            return edited, [_pointer("reshardings", i, "steps", 0, "kind")]
        if nonsense == "no axis":
            steps[0]["mesh_axes"] = ["nope"]
            return edited, [_pointer("reshardings", i, "steps", 0, "mesh_axes")]
        if nonsense == "null step":
            steps[0] = None
            return edited, [_pointer("reshardings", i, "steps", 0)]
        steps.reverse()
        return edited, [_pointer("reshardings", i)]
    if how == "wrong target":
        resharding["to"] = copy.deepcopy(resharding["from"])
    elif how == "wrong source":
        resharding["from"] = copy.deepcopy(resharding["to"])
    else:
        resharding["consumer"] = draw(st.sampled_from(["nope", "output"] + [o for o in sorted(edited["ops"])
                                                                         if o != resharding["consumer"]]))
    return edited, [_pointer("reshardings", i)]


# Digits outside ASCII that `str.isdigit` accepts: superscripts (which `int` then refuses), and
# Arabic-Indic, extended Arabic-Indic, Devanagari, fullwidth and mathematical bold ones (which
# `int` reads as their values).
OTHER_DIGITS = "\u00b2\u00b3\u00b9\u2070\u0660\u0663\u06f4\u0968\uff10\uff12\uff18\U0001d7d0"


@st.composite
def other_digit_numbers(draw: st.DrawFn) -> str:
    """A number written with at least one digit outside ASCII, among ASCII ones or alone."""
    before = draw(st.sampled_from(["", "1", "2"]))
    after = draw(st.sampled_from(["", "0", "6"]))
    return before + draw(st.sampled_from(OTHER_DIGITS)) + after
