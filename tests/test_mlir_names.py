"""SSA names: each hint gets the first free `%hint`, `%hint_1`, `%hint_2`, ... exactly as a plain
search from the start would give, also when hints collide with suffixed names."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from autoshard.mlir.text import Body


def first_free(taken: set[str], base: str) -> str:
    candidate, n = base, 0
    while candidate in taken:
        n += 1
        candidate = f"{base}_{n}"
    return candidate


@given(st.lists(st.sampled_from(["in", "in_1", "in_2", "out", "x", "x_1", "1x", "a.b", "in_1_1"]), max_size=60))
def test_names_are_the_first_free_suffix(hints):
    body, taken = Body(), set()
    for hint in hints:
        base = hint if hint[0].isalpha() else "v" + hint  # every character of these hints is allowed
        expected = first_free(taken, base)
        taken.add(expected)
        assert body.name(hint) == "%" + expected


def test_a_thousand_names_of_one_hint_are_numbered_in_order():
    body = Body()
    assert [body.name("in") for _ in range(1000)][-2:] == ["%in_998", "%in_999"]
