"""The IOPDDL problem type: validation, JSON round trip, and scoring exactly as the contest."""

from pathlib import Path

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.solver import FORBIDDEN_COST, Problem, read_iopddl, score, write_iopddl

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def example() -> Problem:
    return read_iopddl(DATA / "iopddl_example.json")


def test_example_is_read_with_matrices_row_major(example):
    assert example.num_nodes == 5 and example.num_edges == 5 and example.usage_limit == 50
    assert example.edge_costs[2].tolist() == [[90, 10], [20, 80]]  # edge (1, 3): 2 x 2
    assert example.edge_costs[1].tolist() == [[50, 10, 40]]        # edge (0, 2): 1 x 3


def test_score_by_hand(example):
    # Nodes 15+55+25+85+95; edges 30+50+90+60+70; at steps 50..69 nodes 0,1,2 use 10+25+15 = 50.
    first = score(example, [0, 0, 0, 0, 0])
    assert (first.cost, first.feasible, first.peak_usage) == (575, True, 50)
    # Nodes 15+65+45+75+95; edges 40+10+80+20+60; steps 50..69 use 10+25+20 = 55 > 50.
    over = score(example, [0, 1, 1, 1, 0])
    assert (over.cost, over.feasible, over.peak_usage) == (505, False, 55)
    assert (over.violated_steps, over.first_violation_step) == (20, 50)
    best = score(example, [0, 0, 2, 1, 0])
    assert (best.cost, best.feasible) == (445, True)


def test_forbidden_costs_add_up_exactly_beyond_int64():
    problem = Problem(node_costs=([FORBIDDEN_COST * 9, 1],) * 2, node_usages=([0, 0],) * 2,
                      intervals=[[0, 1], [0, 1]], edges=[[0, 1]], edge_costs=([[FORBIDDEN_COST * 9, 0], [0, 0]],))
    result = score(problem, [0, 0])
    assert result.cost == 27 * FORBIDDEN_COST and result.forbidden == 3 and result.feasible


def test_no_limit_is_always_feasible():
    problem = Problem(node_costs=([1],), node_usages=([10**12],), intervals=[[0, 5]], edges=[], edge_costs=())
    assert score(problem, [0]).feasible


def test_bad_solutions_name_the_entry(example):
    with pytest.raises(InputError, match="/solution/2"):
        score(example, [0, 0, 3, 0, 0])
    with pytest.raises(InputError, match="one per node"):
        score(example, [0, 0])


def test_validation_names_every_bad_field():
    with pytest.raises(InputError) as error:
        Problem(node_costs=([1, 2], []), node_usages=([1], [1]), intervals=[[0, 1], [-1, 2]],
                edges=[[0, 5], [0, 0]], edge_costs=([1], [1, 2, 3, 4]), usage_limit=-3)
    where = {p.where for p in error.value.problems}
    assert {"/nodes/costs/1", "/nodes/usages/0", "/edges/nodes/0", "/edges/nodes/1", "/usage_limit"} <= where
    with pytest.raises(InputError, match="/edges/costs/0"):
        Problem(node_costs=([1, 2], [3]), node_usages=([1, 1], [1]), intervals=[[0, 1], [0, 1]],
                edges=[[0, 1]], edge_costs=([1, 2, 3],))
    with pytest.raises(InputError, match="int64"):
        Problem(node_costs=([2**70],), node_usages=([0],), intervals=[[0, 1]], edges=[], edge_costs=())


def test_problem_arrays_are_read_only(example):
    with pytest.raises(ValueError):
        example.node_costs[0][0] = 3


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_write_read_round_trip(example, tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    write_iopddl(example, path)
    again = read_iopddl(path)
    assert again.name == example.name and again.usage_limit == example.usage_limit
    assert all(np.array_equal(a, b) for a, b in zip(again.edge_costs, example.edge_costs))
    assert np.array_equal(again.intervals, example.intervals)
    assert score(again, [0, 1, 1, 1, 0]) == score(example, [0, 1, 1, 1, 0])


def test_gzipped_writes_carry_no_time_stamp_or_name(example, tmp_path):
    # Generated benchmark instances are checked against recorded hashes of their files: the
    # gzip header must not depend on when or under which name a file was written.
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    write_iopddl(example, first)
    write_iopddl(example, second)
    header = first.read_bytes()[:10]
    assert header[3] == 0  # no optional fields (no file name)
    assert header[4:8] == b"\0\0\0\0"  # modification time 0
    assert first.read_bytes() == second.read_bytes()
    assert read_iopddl(second).usage_limit == example.usage_limit


def test_reading_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_iopddl(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"problem": {"nodes": {"costs": [[1]], "usages": [[1]]}}}')
    with pytest.raises(InputError, match="intervals"):
        read_iopddl(bad)


def test_contest_instance_b_reads_and_scores():
    problem = read_iopddl(DATA / "iopddl_B.json.gz")
    assert (problem.num_nodes, problem.num_edges, problem.usage_limit) == (816, 1096, 14392528)
    zero = score(problem, [0] * problem.num_nodes)
    assert zero.forbidden > 0 and zero.cost >= FORBIDDEN_COST


def test_a_matrix_shared_by_edges_is_checked_and_stored_once():
    shared = np.array([[0, 4], [4, 0]])
    problem = Problem(node_costs=tuple(np.array([1, 2]) for _ in range(4)),
                      node_usages=tuple(np.array([1, 1]) for _ in range(4)),
                      intervals=np.array([[0, 1]] * 4), edges=np.array([[0, 1], [1, 2], [2, 3]]),
                      edge_costs=(shared, shared, shared.copy()))
    first, second, third = problem.edge_costs
    assert first is second and third is not first
    assert all(np.array_equal(m, shared) and not m.flags.writeable for m in problem.edge_costs)
    # the same object over nodes of another size is checked again, and refused there
    with pytest.raises(InputError, match="/edges/costs/1"):
        Problem(node_costs=(np.array([1, 2]), np.array([1, 2]), np.array([1, 2, 3])),
                node_usages=(np.array([1, 1]), np.array([1, 1]), np.array([1, 1, 1])),
                intervals=np.array([[0, 1]] * 3), edges=np.array([[0, 1], [1, 2]]), edge_costs=(shared, shared))
