"""The real MLIR tools as verifiers and as the upstream partitioner.

- `verify(text, dialect)`: the `shard` spelling goes to `mlir-opt-22` (parse + verify); the
  `mesh` spelling to `mlir-opt-19`, after `to_llvm19` rewrites the reference's `mesh.sharding`
  ops into the sharding attribute LLVM 19 has (`mesh.shard %x to <@mesh, [[0]], partial = sum[1]>`).
  LLVM 19 has no `halo_sizes`, `update_halo` nor `sharded_dims_offsets`: a `mesh` module using any
  of them is renamed word for word into the `shard` spelling (`as_shard_spelling`) and goes to
  `mlir-opt-22`; the few words the rename drops are checked here.
- `upstream_partition(text)`: upstream's `sharding-propagation` then `shard-partition` on a
  `shard` module; `collectives(text)` lists the collectives of a partitioned module, to compare
  upstream's choice with ours.
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

from autoshard.errors import AutoshardError
from autoshard.mesh import Mesh
from autoshard.reductions import REDUCTION_KINDS
from autoshard.resharding import STEP_KINDS, Price
from autoshard.sharding import ceildiv

TOOLS = {"shard": "mlir-opt-22", "mesh": "mlir-opt-19"}
UPSTREAM_PIPELINE = "builtin.module(func.func(sharding-propagation,shard-partition))"


class ToolchainError(AutoshardError):
    """An MLIR tool is missing or rejected a module; the message carries the tool's diagnostics."""


def mlir_opt(text: str, tool: str, args: Sequence[str] = ()) -> str:
    """Run `tool` on `text`; returns the module it prints."""
    if shutil.which(tool) is None:
        raise ToolchainError(f"{tool} is not installed (Debian: apt-get install mlir-{tool.rsplit('-', 1)[1]}-tools)")
    run = subprocess.run([tool, *args, "-"], input=text, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise ToolchainError(f"{tool} rejected the module:\n{run.stderr.strip()}")
    return run.stdout


_SHARDING_OP = re.compile(r"^\s*(%[\w$.]+) = mesh\.sharding (@[\w$.]+) split_axes = (\[.*?\])"
                          r"(?: partial = (\w+)(\[[\d, ]*\]))?( sharded_dims_offsets = .*)? : !mesh\.sharding$")


def to_llvm19(text: str) -> str:
    """The `mesh` spelling as LLVM 19 reads it: sharding ops folded into `mesh.shard`'s attribute.
    Shardings with `sharded_dims_offsets` have no LLVM 19 form (ValueError)."""
    attributes: dict[str, str] = {}
    lines = []
    for line in text.splitlines():
        match = _SHARDING_OP.match(line)
        if match is None:
            lines.append(line)
            continue
        name, mesh, split, kind, axes, offsets = match.groups()
        if offsets:
            raise ValueError(f"{name}: sharded_dims_offsets has no LLVM 19 form")
        attributes[name] = f"<{mesh}, {split}" + (f", partial = {kind}{axes}" if kind else "") + ">"
    out = "\n".join(lines) + "\n"
    return re.sub(r"(mesh\.shard \S+ to )(%[\w$.]+)", lambda m: m.group(1) + attributes[m.group(2)], out)


_BEYOND_LLVM19 = re.compile(r" halo_sizes = | sharded_dims_offsets = |\bmesh\.update_halo ")
_PARTIAL = re.compile(r" partial = (\w+)\[([\d, ]*)\]")
_UPDATE_HALO = re.compile(r"^(\s*)(%[\w$.]+) = mesh\.update_halo (%[\w$.]+) into (%[\w$.]+) on (@[\w$.]+) "
                          r"split_axes = (\[.*?\]) source_halo_sizes = \[([\d, ]*)\] destination_halo_sizes = "
                          r"\[([\d, ]*)\] : (\S+) -> (\S+)$", re.MULTILINE)


def _update_halo_in_place(match: re.Match) -> str:
    """The reference's `update_halo %src into %dst` as upstream's in-place form on `%dst`; a cast of
    `%src` to its own type keeps its declared type checked."""
    indent, result, source, destination, mesh, split, source_halos, destination_halos, source_type, result_type = match.groups()
    if len(source_halos.split(",")) != len(destination_halos.split(",")):
        raise ToolchainError(f"{result}: source_halo_sizes [{source_halos}] and destination_halo_sizes "
                             f"[{destination_halos}] cover different numbers of split dims")
    return (f"{indent}{result}_source = tensor.cast {source} : {source_type} to {source_type}\n"
            f"{indent}{result} = shard.update_halo {destination} on {mesh} split_axes = {split} "
            f"halo_sizes = [{destination_halos}] : {result_type}")


def _dropped_partial(match: re.Match) -> str:
    kind, axes = match.groups()
    if kind not in REDUCTION_KINDS or not all(a.strip().isdigit() for a in axes.split(",") if a.strip()):
        raise ToolchainError(f"bad partial clause {match.group(0).strip()!r}: expected one of {list(REDUCTION_KINDS)} "
                             f"and mesh axis indices")
    return ""


def as_shard_spelling(text: str) -> str:
    """A `mesh` module renamed into the `shard` spelling, for modules LLVM 19 cannot read: the
    same ops word for word, except that `partial` clauses (which the `shard` sharding lacks) are
    checked here and dropped, and `update_halo` becomes upstream's in-place form."""
    text = _UPDATE_HALO.sub(_update_halo_in_place, text)
    text = "\n".join(_PARTIAL.sub(_dropped_partial, line) if "mesh.sharding" in line else line
                     for line in text.splitlines()) + "\n"
    text = re.sub(r"\bmesh\.mesh ", "shard.grid ", text)
    text = re.sub(r"!mesh\.sharding\b", "!shard.sharding", text)
    text = re.sub(r"\bmesh\.(\w+)", r"shard.\1", text)
    text = re.sub(r"\bmesh_axes = ", "grid_axes = ", text)
    return re.sub(r"reduction = <(\w+)>", r"reduction = \1", text)


def _for_tool(text: str, dialect: str) -> tuple[str, str]:
    """The module as the tool that checks it reads it, and that tool."""
    if dialect != "mesh":
        return text, TOOLS["shard"]
    if _BEYOND_LLVM19.search(text):
        return as_shard_spelling(text), TOOLS["shard"]
    return to_llvm19(text), TOOLS["mesh"]


def verify(text: str, dialect: str) -> str:
    """Parse and verify a module with the real tool for its spelling; returns the tool's print."""
    module, tool = _for_tool(text, dialect)
    return mlir_opt(module, tool)


def verify_all(texts: Sequence[str], dialect: str) -> None:
    """Verify many modules with one run per tool (`--split-input-file`); on failure, the error names
    the first module the tool rejects."""
    by_tool: dict[str, list[str]] = {}
    for text in texts:
        module, tool = _for_tool(text, dialect)
        by_tool.setdefault(tool, []).append(module)
    try:
        for tool, modules in by_tool.items():
            mlir_opt("\n// -----\n".join(modules), tool, ["--split-input-file"])
    except ToolchainError:
        for index, text in enumerate(texts):
            try:
                verify(text, dialect)
            except ToolchainError as error:
                raise ToolchainError(f"module {index} of {len(texts)}: {error}") from None
        raise


def upstream_partition(text: str) -> str:
    """Upstream LLVM 22's partition of an annotated `shard` module (arguments become local)."""
    return mlir_opt(text, TOOLS["shard"], [f"--pass-pipeline={UPSTREAM_PIPELINE}"])


@dataclass(frozen=True, slots=True)
class CollectiveUse:
    """A collective found in a partitioned module, with its local input and output shapes."""

    kind: str
    mesh_axes: tuple[int, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    attrs: str  # the attributes after the axes (gather_axis = 1, reduction = sum, ...)

    def names(self, mesh: Mesh) -> tuple[str, ...]:
        return tuple(mesh.axis_names[a] for a in self.mesh_axes)

    def bytes_per_device(self, mesh: Mesh, itemsize: float) -> float:
        """The input buffer, padded to equal chunks along the cut dim (the planner's convention)."""
        shape = list(self.in_shape)
        cut = _PADDED_CUT.search(self.attrs)
        if cut:
            group = mesh.group_size(self.names(mesh))
            shape[int(cut.group(1))] = ceildiv(shape[int(cut.group(1))], group) * group
        return float(math.prod(shape)) * itemsize

    def seconds(self, mesh: Mesh, price: Price, itemsize: float) -> float:
        return price(self.kind, self.names(mesh), self.bytes_per_device(mesh, itemsize))


_PADDED_CUT = re.compile("(?:" + "|".join(k.cut for k in STEP_KINDS.values() if k.padded) + r") = (\d+)")
# The collectives of a step kind, and the shift a permute may become.
_COLLECTIVE = re.compile(r"= (?:shard|mesh)\.(" + "|".join(k for k in STEP_KINDS if k not in ("permute", "update_halo"))
                         + r"|shift) \S+ "
                         r"on @\w+ (?:grid|mesh)_axes = \[([\d, ]*)\](.*?) : tensor<([\dx]*)\w+> -> tensor<([\dx]*)\w+>")


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split("x") if s)


def collectives(text: str) -> list[CollectiveUse]:
    """Every collective of a module, in order."""
    found = []
    for match in _COLLECTIVE.finditer(text):
        kind, axes, attrs, src, dst = match.groups()
        found.append(CollectiveUse(kind, tuple(int(a) for a in axes.split(",") if a.strip()), _shape(src), _shape(dst),
                                   " ".join(attrs.split())))
    return found
