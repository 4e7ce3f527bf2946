"""The JSON type of each scalar attribute an op kind takes, checked when a graph is read.

An attribute name means the same in every kind that takes it (`axis` is a dim, `eps` the
epsilon of a norm), so one row per name serves the whole op table. Without this a wrong type
slips through `validate` and breaks later: `"causal": "no"` is truthy and masks, `axis: 1.0`
indexes numpy with a float after solving. Lists and structured attributes (`dims`, `perm`,
`padding`, `indexing_maps`, a gradient's `forward`) are checked, with their values, by the loops
function of each kind that reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from autoshard.errors import json_type


@dataclass(frozen=True, slots=True)
class AttrType:
    expected: str  # what the message asks for
    accepts: Callable[[Any], bool]


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_integer(value) or (isinstance(value, float) and math.isfinite(value))


INTEGER = AttrType("an integer", _is_integer)
BOOLEAN = AttrType("true or false", lambda value: isinstance(value, bool))
NUMBER = AttrType("a finite number", _is_number)
POSITIVE_NUMBER = AttrType("a positive finite number", lambda value: _is_number(value) and value > 0)
TEXT = AttrType("a string", lambda value: isinstance(value, str))

ATTR_TYPES: dict[str, AttrType] = {
    "axis": INTEGER, "dimension": INTEGER, "k": INTEGER, "num_classes": INTEGER, "wrt": INTEGER, "rows": INTEGER,
    "keepdims": BOOLEAN, "causal": BOOLEAN, "reverse": BOOLEAN,
    "eps": POSITIVE_NUMBER, "scale": NUMBER,
    "dtype": TEXT, "direction": TEXT, "primitive": TEXT, "payload": TEXT, "of": TEXT, "reduction": TEXT,
}


def attribute_problems(attrs: Mapping[str, Any]) -> dict[str, str]:
    """Per attribute of the wrong type: what was expected and what was given."""
    return {name: f"attribute {name!r} must be {ATTR_TYPES[name].expected}, got {value!r} ({json_type(value)})"
            for name, value in attrs.items() if name in ATTR_TYPES and not ATTR_TYPES[name].accepts(value)}
