"""Candidate meshes for a device count on a topology, each with one placement on the machine.

A candidate is a mesh of 1 to 4 axes (each of size >= 2) whose sizes multiply to the device
count, and a mapping of every axis to the physical dims it runs over (`node`/`gpu` on GPU
machines, `x`/`y`/`z` of the slice on TPUs), as `cost_models.binding.mapped_segments` reads it:
axes sharing a physical dim split it in mesh order, the later axis inner. Every mesh order is
tried, so every such stride order is too.

Axis names: `a0`, `a1`, ... by mesh position (a0 outermost in the row-major device numbering); an
axis whose size is fixed (`--fix tp=8`) carries the given name instead.

Two candidates are equivalent when a renaming of the axes and a symmetry of the machine (torus
dims of equal size and wraparound) turns the placement of one into the other: every collective
then costs the same, so only one of them is solved.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import cost_models
from autoshard.errors import InputError, Problem
from autoshard.mesh import MAX_DEVICES, Mesh
from cost_models.binding import Segments, default_segments, mapped_segments
from cost_models.machine import Machine, gpu_machine, tpu_machines

MAX_AXES = 4


@dataclass(frozen=True)
class Candidate:
    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    mapping: tuple[tuple[str, tuple[str, ...]], ...]  # per axis, in mesh order: the physical dims it takes
    nodes: int  # GPU nodes or TPU slices
    slice_shape: tuple[int, ...] | None  # TPU only

    @property
    def mesh(self) -> Mesh:
        return Mesh(self.axis_names, self.axis_sizes)

    @property
    def mesh_text(self) -> str:
        return ",".join(f"{name}={size}" for name, size in zip(self.axis_names, self.axis_sizes))

    @property
    def mapping_json(self) -> dict[str, list[str]]:
        return {axis: list(dims) for axis, dims in self.mapping}

    @property
    def placement_text(self) -> str:
        """`a0:node a1:gpu`, or `a0:x+y a1:z` on a TPU slice (with the slice shape)."""
        text = " ".join(f"{axis}:{'+'.join(dims)}" for axis, dims in self.mapping)
        return f"{text} on {'x'.join(map(str, self.slice_shape))}" if self.slice_shape else text

    @property
    def label(self) -> str:
        return f"{self.mesh_text} [{self.placement_text}]"


@dataclass(frozen=True)
class Enumeration:
    candidates: list[Candidate]  # one per class of equivalent placements
    placements: int  # every (mesh, placement) found, equivalent ones included


def parse_fixed(text: str, where: str = "--fix") -> dict[str, int]:
    """`tp=8,pp=2` -> {"tp": 8, "pp": 2}: axes the candidates must have, by name and size."""
    if not text.strip():
        return {}
    try:
        mesh = Mesh.parse(text)
    except InputError as error:
        raise InputError([Problem(where, p.message) for p in error.problems]) from None
    fixed = dict(zip(mesh.axis_names, mesh.shape))
    problems = fixed_axes_problems(fixed, lambda name: f"{where} {name}")
    if problems:
        raise InputError(problems)
    return fixed


def fixed_axes_problems(fixed: Mapping[str, int], at: Callable[[str], str]) -> list[Problem]:
    """What is wrong with the axes every candidate must have, each at `at(name)`: a name no mesh
    axis can have, a size under 2, or a name a0, a1, ... (those name the axes that are not fixed)."""
    problems = []
    for name, size in fixed.items():
        try:
            Mesh((name,), (size,))
        except InputError as error:
            problems += [Problem(at(name), p.message) for p in error.problems]
            continue
        if size < 2:
            problems.append(Problem(at(name), f"a fixed axis needs a size of at least 2, got {size}"))
        if _is_positional(name):
            problems.append(Problem(at(name), "the names a0, a1, ... are given to the axes that are not fixed"))
    return problems


def _is_positional(name: str) -> bool:
    return name[0] == "a" and name[1:].isdigit()


def machines_for(topology: str, devices: int) -> list[Machine]:
    """GPU: devices / GPUs per node nodes (one node if fewer). TPU: every single-slice shape holding
    the devices, one of each set of shapes equal up to the order of x, y and z (a relabelling of
    the torus); several slices only when no single slice holds them."""
    try:
        profile = cost_models.load_profile(topology)
        if isinstance(profile, cost_models.GpuProfile):
            return [gpu_machine(profile, devices, None)]
        found: dict[tuple[int, ...], Machine] = {}
        for machine in tpu_machines(profile, devices, None, None):
            found.setdefault((machine.nodes, *sorted(machine.slice_shape)), machine)
        return list(found.values())
    except cost_models.TopologyError as error:
        raise InputError([Problem("topology" if f == "topology" else "devices", m)
                          for f, m in error.problems]) from None


# Links between nodes or slices, an order of magnitude slower than those inside one.
SLOW_LINKS = ("network", "dcn")


def slow_axes(topology: str, candidate: Candidate) -> tuple[str, ...]:
    """The candidate's axes placed (at least partly) on links between nodes or slices."""
    machine = next(m for m in machines_for(topology, math.prod(candidate.axis_sizes))
                   if m.nodes == candidate.nodes and (m.slice_shape or None) == candidate.slice_shape)
    slow = {d.name for d in machine.dims if d.link in SLOW_LINKS}
    return tuple(axis for axis, dims in candidate.mapping if slow.intersection(dims))


def ordered_factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every tuple of `parts` integers >= 2 whose product is `n`, in lexicographic order."""
    if parts == 1:
        return [(n,)] if n >= 2 else []
    return [(d, *rest) for d in range(2, n + 1) if n % d == 0 for rest in ordered_factorizations(n // d, parts - 1)]


def enumerate_candidates(topology: str, devices: int, *, max_axes: int = MAX_AXES,
                         fixed: Mapping[str, int] | None = None) -> Enumeration:
    fixed = dict(fixed or {})
    problems = []
    if not isinstance(devices, int) or isinstance(devices, bool) or not 2 <= devices <= MAX_DEVICES:
        problems.append(Problem("devices", f"must be an integer in [2, 2**20], got {devices!r}"))
    if not isinstance(max_axes, int) or not 1 <= max_axes <= MAX_AXES:
        problems.append(Problem("max_axes", f"must be an integer in [1, {MAX_AXES}], got {max_axes!r}"))
    if not problems and len(fixed) > max_axes:
        problems.append(Problem("fix", f"{len(fixed)} fixed axes but at most {max_axes} axes (max_axes)"))
    if not problems and devices % math.prod(fixed.values()):
        problems.append(Problem("fix", f"the fixed axis sizes {fixed} do not divide the {devices} devices"))
    if problems:
        raise InputError(problems)
    classes: dict[tuple, tuple[tuple, Candidate]] = {}
    placements = 0
    for machine in machines_for(topology, devices):
        symmetries = dim_symmetries(machine)
        for parts in range(max(1, len(fixed)), max_axes + 1):
            for sizes in ordered_factorizations(devices, parts):
                for names in _namings(sizes, fixed):
                    for segments, mapping in placements_of(machine, names, sizes):
                        placements += 1
                        signature = placement_signature(machine, segments, names, symmetries)
                        candidate = Candidate(names, sizes, mapping, machine.nodes, machine.slice_shape or None)
                        preference = _preference(machine, names, sizes, segments)
                        if signature not in classes or preference < classes[signature][0]:
                            classes[signature] = (preference, candidate)
    if not classes:
        raise InputError(f"no mesh of at most {max_axes} axes with fixed axes {fixed} lies on {devices} devices of "
                         f"{topology}", "fix" if fixed else "devices")
    ordered = sorted((c for _, c in classes.values()), key=lambda c: (len(c.axis_sizes), c.axis_sizes, c.label))
    return Enumeration(ordered, placements)


def _namings(sizes: tuple[int, ...], fixed: Mapping[str, int]) -> list[tuple[str, ...]]:
    """Every way to give the fixed names to axes of their sizes; the other axes are a{position}."""
    namings = []
    for positions in itertools.permutations(range(len(sizes)), len(fixed)):
        if all(sizes[p] == size for p, size in zip(positions, fixed.values())):
            names = [f"a{i}" for i in range(len(sizes))]
            for p, name in zip(positions, fixed):
                names[p] = name
            namings.append(tuple(names))
    return namings


def placements_of(machine: Machine, names: tuple[str, ...], sizes: tuple[int, ...]):
    """Every explicit mapping of the axes onto non-empty sets of physical dims that binds."""
    dims = [d.name for d in machine.dims]
    subsets = [tuple(dims[i] for i in range(len(dims)) if mask >> i & 1) for mask in range(1, 2 ** len(dims))]
    for choice in itertools.product(subsets, repeat=len(names)):
        held = math.prod(math.prod(machine.dims[dims.index(d)].size for d in chosen) for chosen in choice)
        if held < math.prod(sizes):
            continue  # the dims taken cannot hold the axes
        mapping = dict(zip(names, choice))
        try:
            segments = mapped_segments(machine, names, sizes, mapping)
        except cost_models.BindingError:
            continue
        if any(s.factor == 1 for segs in segments.values() for s in segs):
            continue  # a dim named but left unused: the same placement without it is found too
        yield segments, tuple(zip(names, choice))


def dim_symmetries(machine: Machine) -> list[tuple[int, ...]]:
    """Permutations of the physical dims that map the machine onto itself (equal torus dims)."""
    dims = machine.dims
    return [p for p in itertools.permutations(range(len(dims)))
            if all((dims[i].size, dims[i].link, dims[i].wraps) == (dims[p[i]].size, dims[p[i]].link, dims[p[i]].wraps)
                   for i in range(len(dims)))]


def placement_signature(machine: Machine, segments: Segments, names: tuple[str, ...],
               symmetries: list[tuple[int, ...]]) -> tuple:
    """The placement up to renaming axes and the machine's symmetries: what every collective's price depends on."""
    shape = tuple((d.size, d.link, d.wraps) for d in machine.dims)
    # Only torus links slow down with the stride (a strided ring takes several hops per step); a
    # switch or a NIC reaches every peer alike.
    strided = [d.link == "ici" for d in machine.dims]
    return min((shape, tuple(sorted(tuple(sorted((p[s.dim], s.factor, s.stride if strided[s.dim] else 1)
                                                 for s in segments[name]))
                                    for name in names)))
               for p in symmetries)


def _preference(machine: Machine, names: tuple[str, ...], sizes: tuple[int, ...], segments: Segments) -> tuple:
    """Which member of an equivalence class represents it: the default binding (inner axes on inner
    dims) where it is one, then larger axes outer, then fixed names on the later axes."""
    try:
        default = default_segments(machine, names, sizes) == segments
    except cost_models.BindingError:
        default = False
    return (not default, tuple(-s for s in sizes), tuple(_is_positional(n) for n in names), names)
