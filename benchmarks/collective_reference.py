"""Model against measurement for rows of `tests/data/collective_reference.csv`, priced exactly as
`tests/test_cost_reference.py` prices them (same setups, same units), as a Markdown table.

Run it on two commits to show what a cost-model change does to each row:

    python benchmarks/collective_reference.py --rows h100-32-,b200-32-
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_cost_reference import ROWS, model_value  # noqa: E402  (the test module holds each row's setup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="", help="comma-separated id prefixes (default: every row)")
    args = parser.parse_args()
    prefixes = [p for p in args.rows.split(",") if p] or [""]
    print("| row | unit | measured | model | model / measured | tolerance | within |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for row_id, row in ROWS.items():
        if not any(row_id.startswith(p) for p in prefixes):
            continue
        measured, tolerance = float(row["expected_seconds_or_GBps"]), float(row["tolerance_pct"])
        model = model_value(row_id)
        within = abs(model - measured) <= tolerance / 100 * measured
        print(f"| {row_id} | {row['unit']} | {measured:.4g} | {model:.4g} | {model / measured:.2f} | "
              f"{tolerance:g}% | {'yes' if within else 'no'} |")


if __name__ == "__main__":
    main()
