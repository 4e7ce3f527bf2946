"""The program under rewriting: edits keep its use-def maps and costs exact, an undone edit leaves
no trace, and the worklist makes the changes that trying every site again after each change makes."""

from __future__ import annotations

import pytest

from autoshard.spmd.collective_opt import _better, optimize
from autoshard.spmd.draft import Draft
from autoshard.spmd.program import SpmdProgram
from autoshard.spmd.rewrites import REWRITES
from autoshard.spmd.surgery import RESULT, local_flops
from support.graphs import zoo_programs

PROGRAMS = zoo_programs(("x=2,y=2", "x=4", "x=2,y=2,z=2"), count=6)


def maps_of(program: SpmdProgram) -> tuple[dict[int, int], dict[int, set[int]]]:
    """Producer position and reader positions of every value, rebuilt from scratch."""
    producer = {v.id: i for i, instruction in enumerate(program.body) for v in instruction.outputs}
    users: dict[int, set[int]] = {}
    for i, instruction in enumerate(program.body):
        for v in instruction.inputs:
            users.setdefault(v.id, set()).add(i)
    for v in program.results:
        users.setdefault(v.id, set()).add(RESULT)
    return producer, users


def assert_consistent(draft: Draft) -> None:
    program = draft.program()
    position = {key: i for i, key in enumerate(draft.keys_in_order())}
    producer, users = maps_of(program)
    assert {v: position[k] for v, k in draft.producer.items()} == producer
    assert {v: {position.get(k, RESULT) for k in keys} for v, keys in draft.users.items()} == users
    assert draft.communication_s == pytest.approx(program.communication_seconds(), rel=1e-12, abs=1e-18)
    assert draft.flops == pytest.approx(local_flops(program), rel=1e-12)
    labels = [draft.label(key) for key in draft.keys_in_order()]
    assert labels == sorted(labels) and len(set(labels)) == len(labels)


def every_trial(program: SpmdProgram):
    """Every (rewrite, key) whose rewrite edits the draft, with the draft as it was before."""
    draft = Draft(program)
    for rule in REWRITES:
        for key in draft.keys_in_order():
            if rule.site(draft, key):
                yield draft, rule, key


def test_an_edit_keeps_the_maps_and_costs_exact_and_an_undone_one_leaves_no_trace():
    tried = 0
    for name, program in PROGRAMS:
        for draft, rule, key in every_trial(program):
            mark, before = draft.mark(), draft.program()
            if rule.rewrite(draft, key) is None:
                assert draft.program() == before, (name, rule.name)
                continue
            tried += 1
            assert_consistent(draft)
            draft.rollback(mark)
            assert draft.program() == before and draft.cost() == (mark.communication_s, mark.flops)
            assert_consistent(draft)
    assert tried > 50  # the zoo offers every rewrite many sites


def restart_after_each_change(program: SpmdProgram) -> list[tuple[str, str]]:
    """The reference: after each change, try every rewrite's sites again from the first."""
    draft, changes = Draft(program), []
    progress = True
    while progress:
        progress = False
        for rule in REWRITES:
            for key in draft.keys_in_order():
                if not rule.site(draft, key):
                    continue
                before, mark = draft.cost(), draft.mark()
                what = rule.rewrite(draft, key)
                if what is not None and _better(draft.cost(), before):
                    draft.keep(mark)
                    changes.append((rule.name, what))
                    progress = True
                    break
                draft.rollback(mark)
            if progress:
                break
    return changes


def test_the_worklist_makes_the_changes_of_trying_every_site_again_after_each_change():
    changed = 0
    for name, program in PROGRAMS + zoo_programs(("x=3,y=2",), count=4):
        expected = restart_after_each_change(program)
        assert [(c.rewrite, c.detail) for c in optimize(program)[1]] == expected, name
        changed += len(expected) > 1
    assert changed >= 10  # programs where one change opens or closes the next
