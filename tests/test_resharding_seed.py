"""Every example of the resharding seed (000_65a6ad6dc1be92b1.txt) as a test.

Each lays the seed's unsharded tensor out on the seed's mesh, checks the device contents against
the seed's figure, runs the planned resharding through the simulator and checks the result
against the target figure. The seed names mesh axes by index; here axis `i` is named `m<i>`.
Where the seed names collectives, the planner must choose them or a sequence at most as costly
(built from the seed's collectives and simulated too, so both are shown equivalent).
"""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.mesh import Mesh
from autoshard.resharding import CollectiveStep, bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding
from autoshard.sim import apply_resharding, assemble, distribute
from autoshard.sim import collectives as c
from autoshard.sim.reshard_exec import apply_step

MESH_2x3 = Mesh.of(m0=2, m1=3)
MESH_2x2x2 = Mesh.of(m0=2, m1=2, m2=2)


def seed_tensor(rows: int, cols: int) -> np.ndarray:
    """The seed's tensors: entry (i, j) reads `<i+1><j+1>` (11, 12, ... 21, ...)."""
    return np.array([[10 * (i + 1) + j + 1 for j in range(cols)] for i in range(rows)])


def sharding(text: str) -> Sharding:
    return Sharding.parse(text)


def assert_contents(shards, figure) -> None:
    assert set(shards) == set(figure)
    for device, expected in figure.items():
        np.testing.assert_array_equal(shards[device], np.array(expected), err_msg=f"device {device}")


def check_example(mesh, tensor, source, target, source_figure, target_figure):
    """Layout matches the source figure, the planned resharding yields the target figure."""
    before = distribute(tensor, mesh, source)
    assert_contents(before, source_figure)
    plan = plan_resharding(mesh, tensor.shape, 1, source, target, bytes_moved_price(mesh))
    after = apply_resharding(before, mesh, plan)
    assert_contents(after, target_figure)
    return plan


def seed_leg(mesh, shape, before, after, kind) -> CollectiveStep:
    """The single collective of `kind` that the seed names for `before -> after`."""
    base = bytes_moved_price(mesh)
    allowed = "send_recv" if kind == "permute" else kind
    plan = plan_resharding(mesh, shape, 1, before, after,
                           lambda k, axes, b: base(k, axes, b) if k == allowed else 1e9)
    assert [s.kind for s in plan.steps] == [kind], f"{before} -> {after} is not one {kind}"
    return plan.steps[0]


def run_seed_sequence(mesh, tensor, shardings, kinds):
    """Simulate the seed's named sequence; return its total price and final contents."""
    shards = distribute(tensor, mesh, shardings[0])
    seconds = 0.0
    for before, after, kind in zip(shardings, shardings[1:], kinds):
        step = seed_leg(mesh, tensor.shape, before, after, kind)
        shards = apply_step(shards, mesh, tensor.shape, step)
        seconds += step.seconds
    return seconds, shards


def target_shard_bytes(mesh, shape, target, dtype_bytes=1) -> float:
    return float(np.prod(target.max_local_shape(mesh, shape))) * dtype_bytes


# --- examples 1 and 2: a "2x3 tensor" split six ways ---------------------------------------
# As written, both split dim 0 (size 2) of a 2x3 tensor over 6 devices, yet the figures show one
# element per device. Example 1's figures and its algorithm (swap contents on devices with the
# same linear index) fit exactly one reading: the six values as a 1-D tensor [11 12 13 21 22 23].
FLAT = np.array([11, 12, 13, 21, 22, 23])


def test_example_1_axis_order_swap_is_one_permutation():
    plan = check_example(
        MESH_2x3, FLAT, sharding("[[m0, m1]]"), sharding("[[m1, m0]]"),
        {(0, 0): [11], (0, 1): [12], (0, 2): [13], (1, 0): [21], (1, 1): [22], (1, 2): [23]},
        {(0, 0): [11], (0, 1): [13], (0, 2): [22], (1, 0): [12], (1, 1): [21], (1, 2): [23]})
    (step,) = plan.steps
    assert step.kind == "permute"
    # "Swap contents on devices that have the same linear index in the 2 shardings".
    source_index = {d: MESH_2x3.in_group_linear(d, ("m0", "m1")) for d in MESH_2x3.devices()}
    target_index = {d: MESH_2x3.in_group_linear(d, ("m1", "m0")) for d in MESH_2x3.devices()}
    expected = {(s, t) for s in MESH_2x3.devices() for t in MESH_2x3.devices()
                if s != t and source_index[s] == target_index[t]}
    assert set(step.pairs) == expected
    assert plan.max_bytes_received_per_device == 1


def test_example_2_as_drawn_is_a_gather_over_axis_0():
    # The figures of example 2 show device (m, n) holding column n of the 2x3 tensor after an
    # all-gather along mesh axis 0, and element (m, n) before: that is [[m0], [m1]] -> [[], [m1]]
    # on the 2x3 tensor, and the seed's algorithm (all-gather along mesh axis 0) is exact for it.
    plan = check_example(
        MESH_2x3, seed_tensor(2, 3), sharding("[[m0], [m1]]"), sharding("[[], [m1]]"),
        {(0, 0): [[11]], (0, 1): [[12]], (0, 2): [[13]], (1, 0): [[21]], (1, 1): [[22]], (1, 2): [[23]]},
        {(m, n): [[11 + n], [21 + n]] for m in range(2) for n in range(3)})
    assert [(s.kind, s.mesh_axes, dict(s.dims)) for s in plan.steps] == [("all_gather", ("m0",), {"gather_axis": 0})]


def test_example_2_as_labelled_drops_a_major_axis():
    # Read as labelled, [[m0, m1]] -> [[m1]] on the six values drops the major axis: device (m, n)
    # must hold elements [2n, 2n+2). The all-gather along axis 0 the seed names gathers elements
    # n and n+3 instead (what its figure shows), so it cannot be the algorithm for this label.
    source, target = sharding("[[m0, m1]]"), sharding("[[m1]]")
    plan = check_example(
        MESH_2x3, FLAT, source, target,
        {(0, 0): [11], (0, 1): [12], (0, 2): [13], (1, 0): [21], (1, 1): [22], (1, 2): [23]},
        {(m, n): FLAT[2 * n: 2 * n + 2] for m in range(2) for n in range(3)})
    gathered = c.all_gather(distribute(FLAT, MESH_2x3, source), MESH_2x3, ("m0",), 0)
    np.testing.assert_array_equal(gathered[(0, 1)], [12, 22])
    assert plan.max_bytes_received_per_device <= target_shard_bytes(MESH_2x3, FLAT.shape, target)


def test_example_3_gather_over_the_minor_axis():
    # The header says a 4x6 tensor; the tensor and figures are 2x6.
    plan = check_example(
        MESH_2x3, seed_tensor(2, 6), sharding("[[], [m0, m1]]"), sharding("[[], [m0]]"),
        {(m, n): [[11 + 3 * m + n], [21 + 3 * m + n]] for m in range(2) for n in range(3)},
        {(m, n): [[11 + 3 * m, 12 + 3 * m, 13 + 3 * m], [21 + 3 * m, 22 + 3 * m, 23 + 3 * m]]
         for m in range(2) for n in range(3)})
    assert [(s.kind, s.mesh_axes, dict(s.dims)) for s in plan.steps] == [("all_gather", ("m1",), {"gather_axis": 1})]


def test_example_4_dropping_a_major_axis_needs_more_than_a_gather():
    tensor = seed_tensor(4, 8)
    source, middle, target = sharding("[[m0], [m1, m2]]"), sharding("[[m0], [m2, m1]]"), sharding("[[m0], [m2]]")
    plan = check_example(
        MESH_2x2x2, tensor, source, target,
        {(0, 0, 0): [[11, 12], [21, 22]], (0, 0, 1): [[13, 14], [23, 24]],
         (0, 1, 0): [[15, 16], [25, 26]], (0, 1, 1): [[17, 18], [27, 28]],
         (1, 0, 0): [[31, 32], [41, 42]], (1, 0, 1): [[33, 34], [43, 44]],
         (1, 1, 0): [[35, 36], [45, 46]], (1, 1, 1): [[37, 38], [47, 48]]},
        {(a, b, cc): tensor[2 * a: 2 * a + 2, 4 * cc: 4 * cc + 4] for a in range(2) for b in range(2) for cc in range(2)})
    # "Can't be done with just an all-gather along mesh axis 1."
    wrong = c.all_gather(distribute(tensor, MESH_2x2x2, source), MESH_2x2x2, ("m1",), 1)
    np.testing.assert_array_equal(wrong[(0, 0, 1)], [[13, 14, 17, 18], [23, 24, 27, 28]])
    # The seed's decomposition: swap to [[0], [2, 1]], then all-gather along axis 1.
    seconds, shards = run_seed_sequence(MESH_2x2x2, tensor, [source, middle, target], ["permute", "all_gather"])
    np.testing.assert_array_equal(assemble(shards, MESH_2x2x2, target, tensor.shape), tensor)
    assert plan.seconds <= seconds
    assert plan.max_bytes_received_per_device <= target_shard_bytes(MESH_2x2x2, tensor.shape, target)


# --- the open cases: [[0], [1]] -> [[1], [0]] -------------------------------------------------

def test_example_5_dim_swap_on_2x3():
    tensor = seed_tensor(6, 6)
    source, target = sharding("[[m0], [m1]]"), sharding("[[m1], [m0]]")
    drawn_axis1_across = {(m, n): tensor[2 * n: 2 * n + 2, 3 * m: 3 * m + 3] for m in range(2) for n in range(3)}
    drawn = {(0, 0): [[11, 12, 13], [21, 22, 23]], (0, 1): [[31, 32, 33], [41, 42, 43]],
             (0, 2): [[51, 52, 53], [61, 62, 63]], (1, 0): [[14, 15, 16], [24, 25, 26]],
             (1, 1): [[34, 35, 36], [44, 45, 46]], (1, 2): [[54, 55, 56], [64, 65, 66]]}
    assert_contents(drawn_axis1_across, drawn)  # the seed's two drawings of the target agree
    plan = check_example(
        MESH_2x3, tensor, source, target,
        {(0, 0): [[11, 12], [21, 22], [31, 32]], (0, 1): [[13, 14], [23, 24], [33, 34]],
         (0, 2): [[15, 16], [25, 26], [35, 36]], (1, 0): [[41, 42], [51, 52], [61, 62]],
         (1, 1): [[43, 44], [53, 54], [63, 64]], (1, 2): [[45, 46], [55, 56], [65, 66]]},
        drawn)
    # No device receives more than its target shard (6 elements); the seed's basis decomposition
    # (all-gather axis 1, all-to-all axis 0, slice axis 1) receives more and costs more.
    assert plan.max_bytes_received_per_device == 6
    seconds, shards = run_seed_sequence(
        MESH_2x3, tensor, [source, sharding("[[m0], []]"), sharding("[[], [m0]]"), target],
        ["all_gather", "all_to_all", "all_slice"])
    assert_contents(shards, drawn)
    assert plan.seconds < seconds


def test_example_6_dim_swap_on_2x6():
    tensor = seed_tensor(6, 6)
    mesh = Mesh.of(m0=2, m1=6)
    source_figure = {(m, n): [[10 * (3 * m + r + 1) + n + 1] for r in range(3)] for m in range(2) for n in range(6)}
    # Figure typo: the seed draws device (0, 4) as 15 / 23 / 35; element (1, 4) of the tensor is 25.
    source_figure[(0, 4)] = [[15], [25], [35]]
    target_figure = {(m, n): [[10 * (n + 1) + 3 * m + k + 1 for k in range(3)]] for m in range(2) for n in range(6)}
    assert target_figure[(1, 2)] == [[34, 35, 36]]
    plan = check_example(mesh, tensor, sharding("[[m0], [m1]]"), sharding("[[m1], [m0]]"), source_figure, target_figure)
    assert plan.max_bytes_received_per_device <= 3


def test_example_7_shard_index_maps():
    # The seed's inverse maps: [[0], [1]]: t[i, j] = d(i // ceil(K/M), j // ceil(L/N))[i % ceil(K/M), j % ceil(L/N)];
    # checked there at i=13, j=17, M=3, N=4, K=16, L=23: t[13, 17] = d(2, 2)[1, 5].
    mesh, tensor = Mesh.of(m0=3, m1=4), np.arange(16 * 23).reshape(16, 23)
    shards = distribute(tensor, mesh, sharding("[[m0], [m1]]"))
    assert shards[(2, 2)][1, 5] == tensor[13, 17]
    for i, j in np.ndindex(tensor.shape):
        assert shards[(i // 6, j // 6)][i % 6, j % 6] == tensor[i, j]
    # [[1], [0]]: t[i, j] = d(j // ceil(L/M), i // ceil(K/N))[i % ceil(K/N), j % ceil(L/M)]. The seed's
    # check (i=9, j=19, M=5, N=2, K=27, L=14) has j >= L and lands on device row 6 of 5; K and L are
    # swapped there, so the map is checked on K=27, L=20 (ceil(K/N) = 14, ceil(L/M) = 4).
    mesh, tensor = Mesh.of(m0=5, m1=2), np.arange(27 * 20).reshape(27, 20)
    shards = distribute(tensor, mesh, sharding("[[m1], [m0]]"))
    for i, j in np.ndindex(tensor.shape):
        assert shards[(j // 4, i // 14)][i % 14, j % 4] == tensor[i, j]


def test_example_8_transfer_tiles_match_the_seed_figure():
    # The seed's tile figure for [[0], [1]] -> [[1], [0]] on 2x3: rows cut at K/3, K/2, 2K/3 and
    # columns at L/3, L/2, 2L/3; each tile labelled (source device, target device), devices
    # written 11..23 for (0, 0)..(1, 2).
    figure = [["11 11", "12 11", "12 21", "13 21"],
              ["11 12", "12 12", "12 22", "13 22"],
              ["21 12", "22 12", "22 22", "23 22"],
              ["21 13", "22 13", "22 23", "23 23"]]
    tensor = seed_tensor(6, 6)
    source, target = sharding("[[m0], [m1]]"), sharding("[[m1], [m0]]")
    plan = plan_resharding(MESH_2x3, tensor.shape, 1, source, target, bytes_moved_price(MESH_2x3))
    (step,) = plan.steps
    cuts = [0, 2, 3, 4, 6]
    device = lambda label: (int(label[0]) - 1, int(label[1]) - 1)  # noqa: E731
    expected = {(device(cell[:2]), device(cell[3:]), ((cuts[r], cuts[r + 1]), (cuts[k], cuts[k + 1])))
                for r, row in enumerate(figure) for k, cell in enumerate(row)}
    actual = set()
    for t in step.dims["transfers"]:
        origin = [s.start for s in source.device_slices(MESH_2x3, tensor.shape, t.source)]
        actual.add((t.source, t.target, tuple((a + o, b + o) for (a, b), o in zip(t.source_box, origin))))
    assert actual == expected


# --- examples 9 and 10: moving an axis to another dim -----------------------------------------

def test_example_9_all_to_all_on_a_1d_mesh():
    tensor, mesh = seed_tensor(6, 6), Mesh.of(m0=3)
    plan = check_example(
        mesh, tensor, sharding("[[m0], []]"), sharding("[[], [m0]]"),
        {(i,): tensor[2 * i: 2 * i + 2] for i in range(3)},
        {(i,): tensor[:, 2 * i: 2 * i + 2] for i in range(3)})
    (step,) = plan.steps
    assert (step.kind, step.mesh_axes, dict(step.dims)) == ("all_to_all", ("m0",), {"split_axis": 1, "concat_axis": 0})
    assert (step.in_local_shape, step.out_local_shape) == ((2, 6), (6, 2))


def test_example_10_axis_moves_between_dims_on_2x2x2():
    tensor = seed_tensor(4, 4)
    source, middle, target = sharding("[[m0], [m1, m2]]"), sharding("[[m0], [m2, m1]]"), sharding("[[m0, m1], [m2]]")
    target_figure = {(0, 0, 0): [[11, 12]], (0, 0, 1): [[13, 14]], (0, 1, 0): [[21, 22]], (0, 1, 1): [[23, 24]],
                     (1, 0, 0): [[31, 32]], (1, 0, 1): [[33, 34]], (1, 1, 0): [[41, 42]], (1, 1, 1): [[43, 44]]}
    # Figure typo: the seed draws device (0, 0, 1) as "13 41"; row 0 of the tensor holds 13 14.
    plan = check_example(
        MESH_2x2x2, tensor, source, target,
        {(0, 0, 0): [[11], [21]], (0, 0, 1): [[12], [22]], (0, 1, 0): [[13], [23]], (0, 1, 1): [[14], [24]],
         (1, 0, 0): [[31], [41]], (1, 0, 1): [[32], [42]], (1, 1, 0): [[33], [43]], (1, 1, 1): [[34], [44]]},
        target_figure)
    # "all_to_all mesh_axes = [2] ... is not enough": its types (2x1 -> 1x2) split dim 0 and
    # concatenate dim 1 (its split/concat attributes are written swapped), giving [[m0, m2], [m1]].
    moved = c.all_to_all(distribute(tensor, MESH_2x2x2, source), MESH_2x2x2, ("m2",), 0, 1)
    np.testing.assert_array_equal(assemble(moved, MESH_2x2x2, sharding("[[m0, m2], [m1]]"), tensor.shape), tensor)
    seconds, shards = run_seed_sequence(MESH_2x2x2, tensor, [source, middle, target], ["permute", "all_to_all"])
    assert_contents(shards, target_figure)
    assert plan.seconds <= seconds


# --- the basis and the decompositions ---------------------------------------------------------

@pytest.mark.parametrize("source, target, kinds", [
    ("[[]]", "[[m1]]", ["all_slice"]),            # replicate -> split: slices, no communication
    ("[[m0]]", "[[]]", ["all_gather"]),           # split -> replicate
    ("[[m0, m1]]", "[[m1, m0]]", ["permute"]),    # swap axis order: devices with the same linear index
    ("[[m0], []]", "[[], [m0]]", ["all_to_all"]),  # move an axis to another dim
])
def test_basis_reshardings(source, target, kinds):
    tensor = seed_tensor(6, 6)
    s, t = sharding(source), sharding(target)
    plan = plan_resharding(MESH_2x3, tensor.shape, 1, s, t, bytes_moved_price(MESH_2x3))
    assert [step.kind for step in plan.steps] == kinds
    out = apply_resharding(distribute(tensor, MESH_2x3, s), MESH_2x3, plan)
    np.testing.assert_array_equal(assemble(out, MESH_2x3, t, tensor.shape), tensor)
    if kinds == ["all_slice"]:
        assert plan.seconds == 0 and plan.max_bytes_received_per_device == 0


def test_basis_drop_major_axis_is_not_a_plain_gather():
    # The basis lists [[0, 1]] -> [[1]] under "all-gather along mesh axis 0"; that gathers a strided
    # set of shards (see example 2). The planner's exchange receives at most the target shard.
    tensor = seed_tensor(6, 6)
    s, t = sharding("[[m0, m1]]"), sharding("[[m1]]")
    plan = plan_resharding(MESH_2x3, tensor.shape, 1, s, t, bytes_moved_price(MESH_2x3))
    out = apply_resharding(distribute(tensor, MESH_2x3, s), MESH_2x3, plan)
    np.testing.assert_array_equal(assemble(out, MESH_2x3, t, tensor.shape), tensor)
    assert plan.max_bytes_received_per_device <= target_shard_bytes(MESH_2x3, tensor.shape, t)


def test_decomposition_of_the_dim_swap():
    tensor = seed_tensor(6, 6)
    chain = [sharding(x) for x in ("[[m0], [m1]]", "[[m0], []]", "[[], [m0]]", "[[m1], [m0]]")]
    seconds, shards = run_seed_sequence(MESH_2x3, tensor, chain, ["all_gather", "all_to_all", "all_slice"])
    np.testing.assert_array_equal(assemble(shards, MESH_2x3, chain[-1], tensor.shape), tensor)
    plan = plan_resharding(MESH_2x3, tensor.shape, 1, chain[0], chain[-1], bytes_moved_price(MESH_2x3))
    assert plan.seconds <= seconds


def test_decomposition_on_a_4d_mesh():
    mesh = Mesh.of(m0=2, m1=2, m2=2, m3=2)
    tensor = np.arange(8 * 8 * 8).reshape(8, 8, 8)
    chain = [sharding(x) for x in ("[[m3, m2], [], [m0, m1]]", "[[m3, m2], [m1], [m0]]", "[[m3], [m1, m2], [m0]]",
                                   "[[], [m1, m2], [m0]]", "[[m0], [m1, m2], []]")]
    seconds, shards = run_seed_sequence(mesh, tensor, chain, ["all_to_all", "all_to_all", "all_gather", "all_to_all"])
    np.testing.assert_array_equal(assemble(shards, mesh, chain[-1], tensor.shape), tensor)
    plan = plan_resharding(mesh, tensor.shape, 1, chain[0], chain[-1], bytes_moved_price(mesh))
    out = apply_resharding(distribute(tensor, mesh, chain[0]), mesh, plan)
    np.testing.assert_array_equal(assemble(out, mesh, chain[-1], tensor.shape), tensor)
    assert plan.seconds <= seconds
