"""Device groups and in-group indices, as the mesh reference defines them on its examples."""

from __future__ import annotations

from autoshard.mesh import Mesh

MESH = Mesh.of(a=2, b=3, c=4, d=5)  # the reference's 2x3x4x5 mesh; axis i is the i-th name


def test_groups_of_axes_0_and_1():
    groups = MESH.device_groups(("a", "b"))
    # one group per (k, m) of the axes outside [0, 1], each holding every (i, j)
    assert len(groups) == 4 * 5
    assert all(len(g) == 6 for g in groups)
    assert [MESH.group_key(g[0], ("a", "b")) for g in groups] == [(k, m) for k in range(4) for m in range(5)]
    assert MESH.group_key((1, 0, 2, 3), ("a", "b")) == MESH.group_key((1, 1, 2, 3), ("a", "b"))
    assert MESH.group_key((1, 0, 2, 4), ("a", "b")) != MESH.group_key((1, 0, 2, 3), ("a", "b"))
    assert sorted(d for g in groups for d in g) == sorted(MESH.devices())


def test_in_group_order_is_induced_by_axes_order():
    # axes [3, 1]: (i, 1, k, 0) precedes both (i, 0, k, 1) and (i, 2, k, 0)
    axes = ("d", "b")
    for i in range(2):
        for k in range(4):
            first = MESH.in_group_linear((i, 1, k, 0), axes)
            assert first < MESH.in_group_linear((i, 0, k, 1), axes)
            assert first < MESH.in_group_linear((i, 2, k, 0), axes)
    group = MESH.device_groups(axes)[0]
    assert group[:4] == [(0, 0, 0, 0), (0, 1, 0, 0), (0, 2, 0, 0), (0, 0, 0, 1)]
    assert [MESH.in_group_linear(dev, axes) for dev in group] == list(range(15))


def test_in_group_device_of_a_3d_mesh():
    # mesh_axes [0, 2] on a 3-D mesh: in-group device (i, j) of the group g is (i, g, j)
    mesh = Mesh.of(x=2, y=3, z=4)
    for g in range(3):
        assert mesh.device_in_group((g,), ("x", "z"), (1, 3)) == (1, g, 3)
        assert mesh.in_group_index((1, g, 3), ("x", "z")) == (1, 3)


def test_linear_index_of_the_reference():
    mesh = Mesh.of(x=10, y=20, z=30)
    assert mesh.linear_index((1, 2, 3)) == 3 + 30 * 2 + 20 * 30 * 1
