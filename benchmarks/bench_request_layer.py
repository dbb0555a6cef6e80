"""Request-layer speed: KVManager decode step vs the chain's own take, the price memo,
window-tail trimming, and (``--full-hour``) the default ``kvchain simulate`` run.

Run: ``python benchmarks/bench_request_layer.py [--full-hour] [--profile]``, or
``--scaling [--quick]`` for the decode-step scaling table alone, or ``--profile-step`` for
a cProfile of the decode step of 256 requests (each chain, cache off and on). Ratios are measured in
the same run; times are this thread's CPU time (``time.thread_time``), so other processes
on a shared machine inflate them less than wall time would:

* ``--scaling``: the decode step as the scheduler runs it (``decode_demands``,
  ``KVManager.allocate`` of the ``(rid, 1)`` batch, ``commit_decodes``) at batch 16, 64,
  256 and 512, on a two-band (gpt-oss-120b: window + full) and a three-band
  (Jet-Nemotron-2B: state + window + full) chain from the catalog, with the prefix cache
  off and on (requests attached with their page keys, as the simulator does): the step,
  the ``Chain.take`` inside it, their ratio (target at batch 256: <= 1.5x) and the
  request-layer cost per request, ``(step - take) / batch`` (target: flat from 16 to
  512). Medians over repeats of one page cycle of steps (``P = 16`` steps: every request
  crosses one page boundary in each), so each repeat does the same page work;

* decode step, 256 requests: ``decode demands + KVManager.allocate + commit`` per step,
  the per-request path (``demand``/``commit`` per request) and the batched path
  (``decode_demands``/``commit_decodes``, vectorized over the batch), each against the
  time of the ``Chain.take`` inside the same steps (target: step <= 2x take); for the
  batched path also its parts (demands, building the ``(rid, 1)`` batch, allocate less
  its take, commit with its one ``Chain.release`` per window band) and the cost of the
  block tables of every band (``KVManager.block_table``, physical ids) per step;
* ``price``: a repeat of ``Chain.price`` on an unchanged chain (the chain's memo; target
  <= 0.5 us), the pure ``price`` on a snapshot, and the planner itself on three bands
  (``_price_uncached``; target <= 5 us);
* window-tail trim of 248 window pages after a 4,096-token prefill (``W = 128``,
  ``P = 16``): one ``commit`` against 248 single-page ``Chain.release`` calls;
* scheduler step with 1,000 and 20,000 waiting requests (FCFS and SPF, memory full so the
  walk stops at once): the step should not grow with the queue (FCFS ``O(1)``, SPF a heap:
  ``O(log n)``);
* ``--full-hour``: the Azure conversation hour exactly as the CLI runs it, in a child
  process: ``kvchain simulate --trace azure-conv --requests 19366 --end-s 3600
  --rate-scale 1 --no-prefix-cache`` (gpt-oss-120b, H200; target <= 25 s of wall time on
  one core): wall time of the process, its CPU time (user + system), and the simulation's
  own wall time as the CLI reports it (``wall_s``, without imports); ``--profile`` runs it
  once more in this process under cProfile and prints the top entries (internal time).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
import timeit
from dataclasses import dataclass
from pathlib import Path

from kvchain.alloc.chain import Chain
from kvchain.alloc.pricing import _price_uncached, price
from kvchain.alloc.snapshot import BandSnapshot, ChainSnapshot, Demand
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.catalog.loader import load_model
from kvchain.layout import Anchor, plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager

SHAPES = {
    "window|full (gpt-oss)": [declared_class(LC.WINDOW, 36_864, 128),
                              declared_class(LC.FULL, 36_864)],
    "state|window|full": [declared_class(LC.STATE, 14_745_600),
                          declared_class(LC.WINDOW, 2_048, 1_152),
                          declared_class(LC.FULL, 2_048)],
}


class _TimedChain:
    """Wraps ``chain.take`` to add up its own time."""

    def __init__(self, chain: Chain) -> None:
        self.spent = 0.0
        take = chain.take

        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return take(*args, **kwargs)
            finally:
                self.spent += time.thread_time() - t0

        chain.take = timed  # type: ignore[method-assign]


def decode_steps(classes, batched: bool, running: int = 256, steps: int = 96,
                 tables: bool = False) -> tuple[float, float, dict[str, float]]:
    """Mean thread CPU seconds per decode step and per take inside it, plus (batched)
    the parts of the step."""
    layout = plan_layout(classes, 400_000_000_000, 16)
    chain = Chain(layout)
    kv = KVManager(chain)
    prompts = [running_prompt(i) for i in range(running)]
    kv.allocate(list(enumerate(prompts)))
    for rid, n in enumerate(prompts):
        kv.commit(rid, n)
    timer = _TimedChain(chain)
    rids = list(range(running))
    total = 0.0
    parts = dict.fromkeys(("demands", "batch", "allocate less take", "commit",
                           "block tables"), 0.0)
    clock = time.thread_time
    for _ in range(steps):
        if batched:
            t0 = clock()
            demands = kv.decode_demands(rids)
            t1 = clock()
            batch = [(rid, 1) for rid in rids]
            t2 = clock()
            before = timer.spent
            kv.allocate(batch, demands)
            t3 = clock()
            kv.commit_decodes(rids)
            t4 = clock()
            total += t4 - t0
            parts["demands"] += t1 - t0
            parts["batch"] += t2 - t1
            parts["allocate less take"] += t3 - t2 - (timer.spent - before)
            parts["commit"] += t4 - t3
            if tables:
                t5 = clock()
                for band in range(len(layout.bands)):
                    kv.reads.block_table(rids, band)
                parts["block tables"] += clock() - t5
        else:
            t0 = clock()
            demands = [kv.demand(rid, 1) for rid in rids]
            kv.allocate([(rid, 1) for rid in rids], demands)
            for rid in rids:
                kv.commit(rid, 1)
            total += clock() - t0
    return total / steps, timer.spent / steps, {k: v / steps for k, v in parts.items()}


PAGE = 16  # tokens per page of every chain below
# Catalog models for the scaling table and the SGLang comparison: (label, catalog name).
CATALOG_SHAPES = (("2-band window|full (gpt-oss-120b)", "gpt-oss-120b"),
                  ("3-band state|window|full (Jet-Nemotron-2B)", "Jet-Nemotron-2B"))
BIG_BUFFER = 100_000_000_000  # bytes: room for every run below (512 requests, cache on)
SCALING_BATCHES = (16, 64, 256, 512)


@dataclass
class Rig:
    """A KVManager on its own chain, built through the public constructors only, so the
    benchmarks keep working when the request layer's internals change: ``timer`` (if any)
    was wrapped around ``chain.take`` before the manager saw the chain."""

    kv: KVManager
    chain: Chain
    timer: _TimedChain | None
    cache: bool


def catalog_rig(model: str, cache: bool, timed: bool = True,
                buffer_bytes: int = BIG_BUFFER) -> Rig:
    """A :class:`Rig` on a fresh chain laid out for a catalog model (``PAGE``-token
    pages), with a prefix cache (default settings, as ``kvchain simulate`` builds it) or
    none; ``timed`` adds up the time of its takes (about 0.3 us more per take)."""
    layout = plan_layout(load_model(model).classes, buffer_bytes, PAGE)
    chain = Chain(layout)
    timer = _TimedChain(chain) if timed else None
    prefix = PrefixCache(CacheGeometry.of(layout)) if cache else None
    return Rig(KVManager(chain, prefix), chain, timer, cache)


def page_keys(rid: int, tokens: int) -> list[int]:
    """Distinct page keys of a prompt of ``tokens`` tokens (one per whole page): no two
    requests share a prefix, so the cache misses and every request holds its own pages."""
    return [rid * 1_000_003 + i for i in range(tokens // PAGE)]


def admit(rig: Rig, prompts: dict[int, int]) -> None:
    """Attach (with a cache), allocate in one batch and commit the prompts ``{rid: tokens}``
    as the scheduler does for a prefill that completes in one step."""
    kv = rig.kv
    if rig.cache:
        for rid, n in prompts.items():
            kv.attach(rid, page_keys(rid, n), n)
    kv.allocate(list(prompts.items()))
    for rid, n in prompts.items():
        kv.commit(rid, n)


def decode_step(kv: KVManager, rids: list[int]) -> None:
    """One decode step through the scheduler's path: demands, one take, one commit. Where
    the request layer has the step plan (``KVManager.plan`` / ``apply``), the scheduler's
    decode-only step plans the decode batch itself and applies it; before it, it
    allocated the ``(rid, 1)`` batch with the decode batch's demands."""
    demands = kv.decode_demands(rids)
    if hasattr(kv, "apply"):
        kv.apply(kv.plan(demands))
    else:
        kv.allocate([(rid, 1) for rid in rids], demands)
    kv.commit_decodes(rids)


def running_prompt(i: int) -> int:
    """Prompt tokens of the ``i``-th request of a running batch: 1,000-1,899, so their
    positions in the page (and the steps at which they cross a page) are spread."""
    return 1_000 + (i * 37) % 900


def running_batch(rig: Rig, running: int) -> list[int]:
    """Admit ``running`` requests (ids 0 to ``running - 1``, :func:`running_prompt`
    tokens each) and return their ids."""
    admit(rig, {rid: running_prompt(rid) for rid in range(running)})
    return list(range(running))


def decode_scaling(model: str, cache: bool, batches: tuple[int, ...],
                   repeats: int = 5) -> dict[int, tuple[float, float]]:
    """Per batch size: median thread CPU seconds per decode step, and per ``Chain.take``
    inside it, over ``repeats`` blocks of ``PAGE`` steps (after one block of warm-up); the
    batch sizes' blocks alternate, so a drift in the machine's load hits them alike."""
    rigs = {running: catalog_rig(model, cache) for running in batches}
    rids = {running: running_batch(rig, running) for running, rig in rigs.items()}
    clock = time.thread_time
    steps: dict[int, list[float]] = {running: [] for running in batches}
    takes: dict[int, list[float]] = {running: [] for running in batches}
    for block in range(repeats + 1):
        for running, rig in rigs.items():
            kv, timer, batch = rig.kv, rig.timer, rids[running]
            assert timer is not None
            before, t0 = timer.spent, clock()
            for _ in range(PAGE):
                decode_step(kv, batch)
            if block:
                steps[running].append((clock() - t0) / PAGE)
                takes[running].append((timer.spent - before) / PAGE)
    return {running: (statistics.median(steps[running]), statistics.median(takes[running]))
            for running in batches}


def print_scaling(repeats: int, batches: tuple[int, ...]) -> None:
    """The scaling table: one row per (chain, cache, batch)."""
    print(f"decode step through the scheduler's path (us, median of {repeats} x {PAGE} "
          f"steps, the batch sizes alternating); ratio = step / its take; per request = "
          f"(step - take) / batch")
    print(f"| chain | prefix cache | batch | step us | take us | step/take | "
          f"per request us | per request x batch {batches[0]} |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, model in CATALOG_SHAPES:
        for cache in (False, True):
            rows = decode_scaling(model, cache, batches, repeats)
            step0, take0 = rows[batches[0]]
            first = (step0 - take0) / batches[0]
            for running, (step, take) in rows.items():
                per = (step - take) / running
                # a take the wrapper did not see (the layer holds its own reference to
                # it) shows as 0: no ratio then, rather than a wrong one
                ratio = f"{step / take:.2f}x" if take else "take not seen"
                print(f"| {label} | {'on' if cache else 'off'} | {running} | "
                      f"{step * 1e6:.1f} | {take * 1e6:.1f} | {ratio} | "
                      f"{per * 1e6:.3f} | {per / first:.2f}x |")


def profile_step(running: int = 256, steps: int = 160, top: int = 12) -> None:
    """cProfile of ``steps`` decode steps of ``running`` requests (after 32 warm-up
    steps) on each catalog chain, cache off and on: the request layer's functions by
    cumulative time per step (us; cProfile's own cost inflates small calls about 2x, so
    read the shares, not the absolute figures)."""
    for label, model in CATALOG_SHAPES:
        for cache in (False, True):
            rig = catalog_rig(model, cache, timed=False)
            rids = running_batch(rig, running)
            for _ in range(32):
                decode_step(rig.kv, rids)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(steps):
                decode_step(rig.kv, rids)
            prof.disable()
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            rows = sorted(((ct / steps * 1e6, nc / steps, f"{Path(fn).name}:{name}")
                           for (fn, _, name), (_, nc, _, ct, _) in stats.items()
                           if "kvchain" in fn), reverse=True)
            print(f"{label}, cache {'on' if cache else 'off'}, batch {running}: "
                  f"us per step (cumulative), calls per step")
            for ct, nc, name in rows[:top]:
                print(f"  {ct:8.1f}  {nc:6.1f}  {name}")


def three_bands() -> ChainSnapshot:
    p = (48, 32, 32)
    return ChainSnapshot(6_784, (
        BandSnapshot("state", Anchor.LOW, p[0], 0, 41 * p[0], 41, 0, 1 << 20),
        BandSnapshot("window", Anchor.FLOAT, p[1], 200 * p[1], 201 * p[1], 1, 0, 1 << 20),
        BandSnapshot("full", Anchor.HIGH, p[2], 6_784, 6_784, 0, 0, 1 << 20)))


def price_times(n: int = 20_000) -> dict[str, float]:
    snap, d = three_bands(), Demand((0, 10, 10))
    out = {}
    # The memo is the chain's (its quote registry, per epoch): a repeated capacity query is
    # Chain.price of the same demand on an unchanged chain.
    chain = Chain(plan_layout(SHAPES["state|window|full"], 40_000_000_000, 16))
    cd = Demand((0, 10, 10))
    chain.price(cd)
    out["repeat: Chain.price, unchanged chain, same demand"] = min(
        timeit.repeat(lambda: chain.price(cd), number=n, repeat=5)) / n
    out["pure price(snapshot, demand) (no memo on trees with the chain's)"] = min(
        timeit.repeat(lambda: price(snap, d), number=n, repeat=5)) / n
    out["cold: the planner on three bands"] = min(
        timeit.repeat(lambda: _price_uncached(snap, d), number=n, repeat=5)) / n
    return out


def trim_times(repeats: int = 30) -> tuple[float, float]:
    classes = SHAPES["window|full (gpt-oss)"]
    one_call, per_page = [], []
    for _ in range(repeats):
        kv = KVManager(Chain(plan_layout(classes, 40_000_000_000, 16)))
        kv.allocate([(0, 4_096)])
        t0 = time.thread_time()
        released = kv.commit(0, 4_096)
        one_call.append(time.thread_time() - t0)
        assert released == 248  # 256 pages, the window keeps ceil((128 - 1) / 16) = 8
        chain = Chain(plan_layout(classes, 40_000_000_000, 16))
        window = chain.layout.bands.index(next(b for b in chain.layout.bands
                                               if b.label == "window"))
        demand = [0] * len(chain.layout.bands)
        demand[window] = 248
        vids = chain.take(Demand(tuple(demand))).pages[window]
        t0 = time.thread_time()
        for v in vids:
            chain.release(window, [v])
        per_page.append(time.thread_time() - t0)
    return statistics.median(one_call), statistics.median(per_page)


def queue_step(waiting: int, policy: str = "fcfs", steps: int = 30) -> float:
    from kvchain.sched.request import Request, StepOutcome
    from kvchain.sched.scheduler import QueuePolicy, Scheduler, SchedulerConfig

    classes = SHAPES["window|full (gpt-oss)"]
    # 64 requests of 1,000 + 500 tokens fill this buffer: the rest wait
    sched = Scheduler(KVManager(Chain(plan_layout(classes, 64 * 1_600 * 2 * 36_864, 16))),
                      SchedulerConfig(max_running=64, max_prefill_tokens=1 << 20,
                                      policy=QueuePolicy(policy)))
    for i in range(64 + waiting):
        # SPF: the 64 shortest arrive first, so they are the ones admitted
        prompt = 1_000 if i < 64 or policy == "fcfs" else 1_000 + i % 997
        sched.add(Request(i, prompt, 500, 0.0), 0.0)
    now = 0.0
    for _ in range(5):  # admit and prefill the running set
        batch = sched.step(now)
        now += 0.01
        sched.complete(batch, StepOutcome(0.01), now)
    gc.disable()  # as timeit does: a collection over 20,000 requests is not the queue's cost
    try:
        t0 = time.thread_time()
        for _ in range(steps):
            batch = sched.step(now)
            now += 0.01
            sched.complete(batch, StepOutcome(0.01), now)
        return (time.thread_time() - t0) / steps
    finally:
        gc.enable()


FULL_HOUR_ARGS = ["simulate", "--trace", "azure-conv", "--requests", "19366", "--end-s", "3600",
                  "--rate-scale", "1", "--no-prefix-cache", "--json"]


def full_hour(profile: bool) -> tuple[float, float, dict, str]:
    """The Azure hour as ``kvchain simulate`` runs it, in a child process (this checkout's
    ``src``): (wall s, CPU s of the child, its JSON output, profile text or "")."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    code = "import sys; from kvchain.cli import main; sys.argv[0] = 'kvchain'; main()"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code, *FULL_HOUR_ARGS], env=env, check=True,
                         capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = json.loads(out)
    assert result["summary"]["requests_total"] == 19_366
    text = ""
    if profile:
        from kvchain.cli import main as cli_main

        argv = sys.argv
        sys.argv = ["kvchain", *FULL_HOUR_ARGS]
        prof = cProfile.Profile()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                prof.enable()
                try:
                    cli_main()
                except SystemExit:
                    pass
                finally:
                    prof.disable()
        finally:
            sys.argv = argv
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(15)
        text = buf.getvalue()
    return wall, cpu, result, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full-hour", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--scaling", action="store_true",
                        help="only the decode-step scaling table (batch 16 to 512)")
    parser.add_argument("--quick", action="store_true",
                        help="with --scaling: a smoke run (1 repeat, batch 16 and 64)")
    parser.add_argument("--profile-step", action="store_true",
                        help="only a cProfile of the decode step of 256 requests per chain "
                             "and cache setting")
    args = parser.parse_args()
    if args.profile_step:
        profile_step()
        return
    if args.scaling:
        if args.quick:
            print_scaling(1, SCALING_BATCHES[:2])
        else:
            print_scaling(9, SCALING_BATCHES)
        return
    print("decode step, 256 requests (us per step; ratio = step / its chain take)")
    for shape, classes in SHAPES.items():
        for batched in (False, True):
            step, take, parts = decode_steps(classes, batched, tables=batched)
            path = "batched    " if batched else "per-request"
            print(f"  {shape:24s} {path} step {step * 1e6:8.1f}  take {take * 1e6:7.1f}  "
                  f"ratio {step / take:5.2f}x")
            if batched:
                print("    " + ", ".join(f"{k} {v * 1e6:.1f}" for k, v in parts.items()))
    print("price (us per call, best of 5 x 20,000)")
    for name, t in price_times().items():
        print(f"  {name:45s} {t * 1e6:7.3f}")
    one, many = trim_times()
    print(f"window-tail trim of 248 pages: one commit {one * 1e6:.1f} us, 248 single-page "
          f"releases {many * 1e6:.1f} us (ratio {one / many:.3f})")
    for policy in ("fcfs", "spf"):
        small, large = float("inf"), float("inf")
        for _ in range(3):  # interleaved, best of 3: the load of a shared machine drifts
            small = min(small, queue_step(1_000, policy))
            large = min(large, queue_step(20_000, policy))
        print(f"scheduler step, {policy.upper()}: {small * 1e6:.0f} us with 1,000 waiting, "
              f"{large * 1e6:.0f} us with 20,000 waiting (ratio {large / small:.2f})")
    if args.full_hour:
        wall, cpu, result, text = full_hour(args.profile)
        summary = result["summary"]
        print(f"kvchain {' '.join(FULL_HOUR_ARGS)}: {wall:.1f} s wall (process), "
              f"{cpu:.1f} s CPU (process), {result['config']['wall_s']:.1f} s wall "
              f"(simulation); {summary['steps']:,} steps, "
              f"{summary['output_tokens_per_s']:,.2f} output tok/s")
        if text:
            print(text)


if __name__ == "__main__":
    main()
