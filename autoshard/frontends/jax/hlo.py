"""The collectives in XLA's compiled (partitioned) HLO text, read back to be set beside a plan's.

Each instruction whose opcode is all-reduce, all-gather, reduce-scatter, all-to-all or
collective-permute gives a `Collective`: its kind, its device groups and the bytes each device
puts in, counted as the plan counts a collective step (`CollectiveStep.bytes_per_device`): the
input buffer, or for a permute what a device receives. Only the opcode is matched (instruction
names are arbitrary), results may be tuples (all-to-all on CPU has one part per peer), and device
groups come in the three spellings XLA prints: explicit `{{0,1},{2,3}}`, iota `[2,2]<=[4]`, and
Shardy's `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`.

XLA:CPU writes a reduce-scatter as an all-reduce whose only users slice out each device's part;
such an all-reduce is reported as the reduce-scatter it stands for (same input buffer). XLA's
combiner may merge independent all-reduces into one of a tuple (the key and value gradients of
context-parallel attention, reduced over the context axis together); each part is reported as the
all-reduce (or reduce-scatter) it was, so the counts stay those of the program's collectives.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
                 "s64": 8, "u64": 8, "f64": 8}

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>.*?)\s(?P<opcode>[a-z][\w\-]*)\("
                          r"(?P<operands>[^)]*)\)(?P<attrs>.*)$")
_ARRAY = re.compile(r"\b(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{(?P<groups>(?:\{[\d,]*\},?)*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(?P<shape>[\d,]+)\]<=\[")
# the mesh form may carry a device order between the axes and the ones used: `, device_ids=([2,4]T(1,0))`
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[(?P<axes>[^\]]*)\][^{]*\{(?P<used>[^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{(?P<pairs>(?:\{\d+,\d+\},?)*)\}")


@dataclass(frozen=True, slots=True)
class Collective:
    kind: str  # one of KINDS
    group_size: int  # devices per group (a permute: 2, a sender and a receiver)
    bytes_per_device: int
    result_type: str
    name: str


def _type_bytes(text: str) -> int:
    return sum(ELEMENT_BYTES.get(m["dtype"], 4) * math.prod(int(d) for d in m["dims"].split(",") if d)
               for m in _ARRAY.finditer(text))


def _group_size(attrs: str, kind: str) -> int:
    if kind == "collective-permute":
        return 2
    if m := _EXPLICIT_GROUPS.search(attrs):
        first = re.search(r"\{([\d,]*)\}", m["groups"])
        return len([d for d in first[1].split(",") if d]) if first else 1
    if m := _IOTA_GROUPS.search(attrs):
        return int(m["shape"].split(",")[-1])
    if m := _MESH_GROUPS.search(attrs):
        sizes = {name: int(size) for name, size in re.findall(r"'(\w+)'=(\d+)", m["axes"])}
        size = 1
        for axis in re.finditer(r"'(?P<axis>\w+)'(?::\(\d+\)(?P<sub>\d+))?", m["used"]):
            size *= int(axis["sub"]) if axis["sub"] else sizes[axis["axis"]]
        return size
    return 1


def compiled_collectives(hlo_text: str) -> list[Collective]:
    """Every collective of the partitioned HLO, in program order (`compiled.as_text()`)."""
    lines = hlo_text.splitlines()
    found = []
    for index, line in enumerate(lines):
        m = _INSTRUCTION.match(line)
        if not m or m["opcode"] not in KINDS:
            continue
        kind, result_bytes = m["opcode"], _type_bytes(m["type"])
        group = _group_size(m["attrs"], kind)
        if kind == "all-gather":
            bytes_in = result_bytes // group
        elif kind == "reduce-scatter":
            bytes_in = result_bytes * group
        else:
            bytes_in = result_bytes
        users = _users(lines, index, m["name"]) if kind == "all-reduce" else []
        parts = [p.group(0) for p in _ARRAY.finditer(m["type"])]
        if kind == "all-reduce" and m["type"].startswith("(") and len(parts) > 1:
            for position, part in enumerate(parts):
                part_users = [u for g in users if _tuple_index(g) == position for u in _users(lines, index, g["name"])]
                sliced = group > 1 and _only_sliced(part_users, _type_bytes(part) // group)
                found.append(Collective("reduce-scatter" if sliced else kind, group, _type_bytes(part), part,
                                        f"{m['name']}[{position}]"))
            continue
        if kind == "all-reduce" and group > 1 and _only_sliced(users, result_bytes // group):
            kind = "reduce-scatter"
        found.append(Collective(kind, group, bytes_in, m["type"], m["name"]))
    return found


def _users(lines: list[str], at: int, name: str) -> list[re.Match[str]]:
    """The instructions reading `name` in its computation, after it (line `at`)."""
    token = re.compile(rf"%{re.escape(name)}(?![\w.\-])")
    users = []
    for line in lines[at + 1:]:
        if line.strip() == "}":  # the end of the computation
            break
        m = _INSTRUCTION.match(line)
        if m and token.search(m["operands"]):
            users.append(m)
    return users


def _tuple_index(instruction: re.Match[str]) -> int | None:
    """The part a get-tuple-element takes; None for any other instruction."""
    found = re.search(r"\bindex=(\d+)", instruction["attrs"])
    return int(found[1]) if instruction["opcode"] == "get-tuple-element" and found else None


def _only_sliced(users: list[re.Match[str]], part_bytes: int) -> bool:
    """Whether every one of `users` keeps only a 1/group part (`part_bytes`)."""
    return bool(users) and all("slice" in (u["opcode"] + u["name"] + u["attrs"])
                               and _type_bytes(u["type"]) == part_bytes for u in users)
