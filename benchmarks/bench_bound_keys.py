"""What the default run spends on prefix-cache page keys and the two hit-rate bounds, on
this tree or on another kvchain source folder.

Run: ``python benchmarks/bench_bound_keys.py [SRC]`` (``SRC``: a kvchain ``src`` folder,
e.g. a ``git worktree`` of an earlier commit; default this tree's). The first 600 requests
of the bundled Mooncake trace at 16 tokens a page (the README's default run): the run's
own page keys, then the infinite-cache bound and an LRU bound of 30,000 pages. A tree
with ``walk_bound`` computes the keys once for all three (round 14); an earlier one
computes them for the run and again inside each ``hit_bound``. Prints the process CPU
seconds, best of ``--runs``. Alternate the two trees in one session for a ratio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> None:
    """Time the keys and both bounds; print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", default=str(Path(__file__).resolve().parents[1]
                                                      / "src"))
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    from kvchain.cache.keys import page_keys_from_blocks
    from kvchain.sim import prefix_bounds
    from kvchain.sim.traces import load_trace

    requests = load_trace("mooncake", first=600).requests
    best = float("inf")
    for _ in range(args.runs):
        start = time.process_time()
        if hasattr(prefix_bounds, "walk_bound"):
            keyed = prefix_bounds.keyed_prompts(requests, 16)
            prefix_bounds.walk_bound(keyed, 16)
            prefix_bounds.walk_bound(keyed, 16, 30_000)
        else:
            for r in requests:
                if r.prefix_block_ids is not None:
                    page_keys_from_blocks(r.prefix_block_ids, 512, r.prompt_tokens, 16)
            prefix_bounds.hit_bound(requests, 16)
            prefix_bounds.hit_bound(requests, 16, capacity_pages=30_000)
        best = min(best, time.process_time() - start)
    print(f"{args.src}: keys + both bounds of 600 requests: {best:.3f} CPU s "
          f"(best of {args.runs})")


if __name__ == "__main__":
    main()
