"""Counts of one scheduler step (issue 20, item 4): how many times the take demand of a
row is computed, the chain prices, and the batch is validated, for one prefill chunk
beside three decodes and for a step of 256 decodes, on a two-band (window | full) and a
three-band (state | window | full) chain.

Run: ``python benchmarks/count_step.py`` (counts, not times: any machine gives the same).
"""

from __future__ import annotations

from kvchain.testing.step_counts import decode_step, mixed_step


def main() -> None:
    print("| step | chain | demand per row (most) | request_demand calls | chain.price "
          "| validations |")
    print("|---|---|---:|---:|---:|---:|")
    for label, fn in (("1 prefill chunk + 3 decodes", mixed_step),
                      ("256 decodes", decode_step)):
        for three in (False, True):
            c = fn(three)
            print(f"| {label} | {'3' if three else '2'} bands | {c.demand_per_row} | "
                  f"{c.demand_calls} | {c.price} | {c.validations} |")


if __name__ == "__main__":
    main()
