"""kvchain's request layer against SGLang's unified hybrid KV allocator, on the same op
streams, in one process (issue 20's side-by-side targets).

Run: ``python benchmarks/bench_vs_sglang.py [--quick] [--repeats N] [--ops M1,M2]``
(``--ops``: only the ops of these methods, e.g. ``capacity_first,trim``); ``--profile
OP`` (``trim``, ``capacity``, ...) prints cProfile's statistics of the kvchain side of
one op instead. Without SGLang importable it prints why, then the kvchain side of every
op stream alone (the ratio columns say ``-``). SGLang on a CPU-only machine, in a virtual
environment of its own beside the CPU torch (``python -m venv --system-site-packages
VENV``, kvchain into it with ``pip install --no-deps -e .``; then what the allocator
modules' imports need, nothing that pulls a CUDA build): ``pip install --no-deps
sglang==0.5.23 psutil pybase64 triton starlette msgspec pyzmq aiohttp multidict yarl
propcache aiohappyeyeballs aiosignal frozenlist dill apache-tvm-ffi sentencepiece
compressed-tensors loguru gguf``. Times are this thread's CPU time
(``time.thread_time``); each op runs in blocks, the kvchain and SGLang blocks
alternating, and every figure is the median over blocks of the mean time per call in a
block.

Chains (kvchain: the catalog models of ``bench_request_layer.CATALOG_SHAPES``, 16-token
pages; SGLang: the same page size and window):

* two-band, full + sliding window (gpt-oss-120b, ``W = 128``): SGLang's
  ``UnifiedSWATokenToKVPoolAllocator`` (``sglang.srt.mem_cache.allocator.
  unified_hybrid_swa``), built by its factory ``init_unified_swa_pools``
  (``sglang.srt.mem_cache.unified_memory_pool``) on one shared ``UnifiedKVPool``;
* three-band, full + window + state (Jet-Nemotron-2B, ``W = 1,152``): SGLang's
  ``UnifiedMambaSWATokenToKVPoolAllocator`` through ``init_unified_mamba_swa_pools``,
  when its CPU construction succeeds (the table says what blocks it otherwise).

The ops, one call each (kvchain through the path the scheduler uses, prefix cache off
and on; SGLang at its allocator, without a radix cache):

* ``decode bs256`` / ``decode bs64``: one decode step of a running batch (1,000-1,899
  prompt tokens). kvchain: ``decode_demands``, ``KVManager.allocate`` of the ``(rid, 1)``
  batch, ``commit_decodes`` (which releases the window pages the step slid past).
  SGLang: what its ``alloc_for_decode`` does at the allocator on a paged pool: the
  ``last_loc`` gather from the request-to-token table, ``alloc_decode``, the write of the
  new slots into the table; plus the sliding-window release of the step: one
  ``free_swa`` of the out-of-window pages of every request whose window start crossed a
  page (found with one vectorised comparison: cheaper than SGLang's own per-request
  ``maybe_evict_swa`` loop, so the SGLang time is a lower bound).
* ``window trim``: a request that has just prefilled 4,096 tokens releases the window
  pages behind its window. kvchain: ``commit(rid, 4096)`` (248 pages for ``W = 128``);
  SGLang: ``free_swa`` of the same out-of-window token slots.
* ``capacity query``: the same question asked again on an unchanged pool. kvchain:
  ``chain.price(demand)`` of a 2,048-token chunk (the scheduler's one pricing per step,
  served from the chain's own memo of the quotes it issued in this epoch), with the same
  ``Demand`` object; (second row) an equal ``Demand`` built anew each call around the
  same pages tuple; (third row) an equal ``Demand`` of a new pages tuple each call
  (``Demand(tuple(pages))``, as the scheduler builds its step's total: ``sum_demands``,
  ``Demand(tuple(totals[j].tolist()))``), which the memo finds by value, not identity;
  (``pages`` rows) the second and third rows through ``Chain.price_pages``, which
  builds no ``Demand`` when the memo holds equal pages; (last row) the third row's query
  asked once after each decode step of the running batch, so each is the first on a new
  epoch (the planner runs; the scheduler's one pricing per step follows its previous
  step's take, so it is mostly this case); SGLang: ``available_size()`` (memoized per
  epoch of its chain; no argument; in the last row recomputed after the step's
  allocation).
* ``prefill``: allocation of a 2,048-token chunk of a new request (64 requests running).
  kvchain: ``demand`` + ``allocate``; SGLang: the length tensors, ``get_last_loc_torch``,
  ``alloc_extend`` and the table write.
* ``release``: a finished request of 2,048 prompt + 16 output tokens (window trimmed).
  kvchain: ``free(rid)``; SGLang: ``free`` of its token slots.

On CPU: SGLang's unified allocator launches Triton kernels for ``alloc_extend`` and
``alloc_decode`` (``allocator/unified_sub_pool.py``), which need a GPU driver; here those
two launches are routed to SGLang's own torch versions of the same kernels
(``alloc_extend_naive`` / ``alloc_decode_naive`` in ``allocator/paged.py``, what its
paged allocator runs when Triton is off), called with the arguments of the launch. When
the installed torchvision cannot load (a CUDA build beside the CPU torch), the
``torchvision`` import that SGLang's model configs make on the way is answered by an
empty stand-in module (no allocator code uses it). Both are reported in the output.
The SGLang pools use one layer of one 8-wide head per band: the allocator's bookkeeping
does not depend on the bytes per slot, and a pool of this many slots then fits in memory.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import importlib.abc
import importlib.machinery
import pstats
import statistics
import sys
import time
import types
import warnings
from collections.abc import Callable
from typing import Any

from bench_request_layer import (
    CATALOG_SHAPES,
    PAGE,
    catalog_rig,
    decode_step,
    page_keys,
    running_batch,
    running_prompt,
)

from kvchain.alloc.snapshot import Demand
from kvchain.catalog.loader import load_model

SGLANG_TESTED = "0.5.23"  # the version this harness was written against
PROMPT = 4_096  # tokens of the prefill before the window trim
CHUNK = 2_048  # tokens of the prefill op and of the released request's prompt
BACKGROUND = 64  # running requests beside the prefill, trim and release ops
MAX_CONTEXT = 8_192  # columns of SGLang's request-to-token table
MAX_REQUESTS = 1_024  # rows of SGLang's request-to-token table
TARGET = 0.8  # issue 20: every op at most 0.8x SGLang's, cache on and off


def window_of(model: str) -> int:
    """The sliding window (tokens) of a catalog model's window band."""
    return next(c.window for c in load_model(model).classes if c.window is not None)


def has_state(model: str) -> bool:
    """Whether a catalog model has a recurrent-state band."""
    return any(c.bytes_per_slot for c in load_model(model).classes)


# --- kvchain side ------------------------------------------------------------------------


class KvchainOps:
    """The op streams on a KVManager (prefix cache off or on); each method runs one block
    of calls and returns thread CPU seconds per call."""

    def __init__(self, model: str, cache: bool, decode_batch: int) -> None:
        self.rig = catalog_rig(model, cache, timed=False)
        self.kv = self.rig.kv
        self.decoding = running_batch(self.rig, decode_batch)
        self.next_rid = 100_000
        self.profile: cProfile.Profile | None = None  # on around the timed calls if set

    def _start(self) -> float:
        if self.profile is not None:
            self.profile.enable()
        return time.thread_time()

    def _stop(self, t0: float) -> float:
        spent = time.thread_time() - t0
        if self.profile is not None:
            self.profile.disable()
        return spent

    def _new(self, tokens: int) -> int:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        if self.rig.cache:
            self.kv.attach(rid, page_keys(rid, tokens), tokens)
        return rid

    def decode(self, calls: int) -> float:
        t0 = self._start()
        for _ in range(calls):
            decode_step(self.kv, self.decoding)
        return self._stop(t0) / calls

    def trim(self, calls: int) -> float:
        spent = 0.0
        for _ in range(calls):
            rid = self._new(PROMPT)
            self.kv.allocate([(rid, PROMPT)])
            t0 = self._start()
            self.kv.commit(rid, PROMPT)
            spent += self._stop(t0)
            self.kv.free(rid)
        return spent / calls

    def capacity(self, calls: int) -> float:
        chain, demand = self.rig.chain, self.kv.demand(self.next_rid, CHUNK)
        chain.price(demand)
        t0 = self._start()
        for _ in range(calls):
            chain.price(demand)
        return self._stop(t0) / calls

    def capacity_fresh(self, calls: int) -> float:
        """As :meth:`capacity`, asked with an equal demand built anew each call around the
        same pages tuple: the ``Demand`` build, then the registry's identity test on the
        pages of its last answer."""
        chain, pages = self.rig.chain, self.kv.demand(self.next_rid, CHUNK).pages
        chain.price(Demand(pages))
        t0 = self._start()
        for _ in range(calls):
            chain.price(Demand(pages))
        return self._stop(t0) / calls

    def capacity_tuple(self, calls: int) -> float:
        """As :meth:`capacity_fresh`, with a new pages tuple each call too (the
        scheduler's build of a step's total): the memo's lookup by value."""
        chain, pages = self.rig.chain, list(self.kv.demand(self.next_rid, CHUNK).pages)
        chain.price(Demand(tuple(pages)))
        t0 = self._start()
        for _ in range(calls):
            chain.price(Demand(tuple(pages)))
        return self._stop(t0) / calls

    def capacity_pages(self, calls: int) -> float:
        """As :meth:`capacity_fresh` through ``Chain.price_pages``: the same pages tuple
        each call and no ``Demand`` built (the memo's identity test on its last
        answer)."""
        chain, pages = self.rig.chain, self.kv.demand(self.next_rid, CHUNK).pages
        chain.price_pages(pages)
        t0 = self._start()
        for _ in range(calls):
            chain.price_pages(pages)
        return self._stop(t0) / calls

    def capacity_pages_tuple(self, calls: int) -> float:
        """As :meth:`capacity_tuple` through ``Chain.price_pages``: a new pages tuple each
        call, no ``Demand`` built (the memo's lookup by value)."""
        chain, pages = self.rig.chain, list(self.kv.demand(self.next_rid, CHUNK).pages)
        chain.price_pages(tuple(pages))
        t0 = self._start()
        for _ in range(calls):
            chain.price_pages(tuple(pages))
        return self._stop(t0) / calls

    def capacity_first(self, calls: int) -> float:
        """The query of :meth:`capacity_tuple` asked once after each decode step of the
        running batch (which moves the chain's epoch): the first price on an epoch, the
        planner's run, as the scheduler's one pricing per step mostly is."""
        chain, pages = self.rig.chain, list(self.kv.demand(self.next_rid, CHUNK).pages)
        spent = 0.0
        for _ in range(calls):
            decode_step(self.kv, self.decoding)
            t0 = self._start()
            chain.price(Demand(tuple(pages)))
            spent += self._stop(t0)
        return spent / calls

    def prefill(self, calls: int) -> float:
        spent = 0.0
        for _ in range(calls):
            rid = self._new(CHUNK)
            t0 = self._start()
            demand = self.kv.demand(rid, CHUNK)
            self.kv.allocate([(rid, CHUNK)], [demand])
            spent += self._stop(t0)
            self.kv.commit(rid, CHUNK)
            self.kv.free(rid)
        return spent / calls

    def release(self, calls: int) -> float:
        spent = 0.0
        for _ in range(calls):
            rid = self._new(CHUNK)
            self.kv.allocate([(rid, CHUNK)])
            self.kv.commit(rid, CHUNK)
            for _ in range(PAGE):
                decode_step(self.kv, [rid])
            t0 = self._start()
            self.kv.free(rid)
            spent += self._stop(t0)
        return spent / calls


# --- SGLang side -------------------------------------------------------------------------


class _Stand(types.ModuleType):
    """An empty module: every attribute is an inert placeholder (for imports SGLang's
    model configs make of torchvision, never called on the allocator's path)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Inert()


class _Inert:
    def __getattr__(self, name: str) -> Any:
        return _Inert()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Inert()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        return _Stand(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []  # type: ignore[attr-defined]


SGL_MODULES = ("sglang.srt.mem_cache.unified_memory_pool",
               "sglang.srt.mem_cache.allocator.unified_sub_pool",
               "sglang.srt.mem_cache.allocator.paged",
               "sglang.srt.mem_cache.allocation",
               "sglang.srt.utils.common")


def load_sglang() -> tuple[dict[str, Any] | None, list[str]]:
    """Import SGLang's allocator modules: (modules by short name, notes), or (None, notes
    saying what failed, with the error text)."""
    notes: list[str] = []

    def modules() -> dict[str, Any]:
        with warnings.catch_warnings():  # its quantization modules warn about CPU at import
            warnings.simplefilter("ignore")
            return {m.rsplit(".", 1)[1]: importlib.import_module(m) for m in SGL_MODULES}

    try:
        mods = modules()
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "sglang":
            return None, [f"SGLang not installed ({exc})"]
        if not _mentions_torchvision(exc):
            return None, [f"SGLang import failed: {type(exc).__name__}: {exc}"]
        notes.append(f"torchvision unusable ({type(exc).__name__}: {str(exc)[:120]}); "
                     f"answered by an empty stand-in module")
        for name in [n for n in sys.modules if n == "torchvision" or
                     n.startswith(("torchvision.", "sglang"))]:
            del sys.modules[name]
        sys.meta_path.insert(0, _StandInFinder())
        try:
            mods = modules()
        except Exception as exc2:
            return None, [*notes, f"SGLang import failed: {type(exc2).__name__}: {exc2}"]
    version = getattr(sys.modules["sglang"], "__version__", "?")
    notes.insert(0, f"SGLang {version} (harness written against {SGLANG_TESTED})")
    if not _has_gpu():
        _route_kernels(mods)
        notes.append("no GPU: unified_sub_pool's alloc_extend/alloc_decode Triton launches "
                     "routed to SGLang's alloc_extend_naive/alloc_decode_naive (paged.py)")
    return mods, notes


def _mentions_torchvision(exc: BaseException) -> bool:
    import traceback

    text = "".join(traceback.format_exception(exc))
    return "torchvision" in text


def _has_gpu() -> bool:
    import torch

    # One intra-op thread: thread CPU time then counts all of torch's work.
    torch.set_num_threads(1)
    return bool(torch.cuda.is_available())


class _Launch:
    """``kernel[grid](*args)`` launcher that calls a torch function instead."""

    def __init__(self, run: Callable[..., None]) -> None:
        self.run = run

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return self.run


def _route_kernels(mods: dict[str, Any]) -> None:
    paged, sub, common = mods["paged"], mods["unified_sub_pool"], mods["common"]

    def extend(prefix_lens: Any, seq_lens: Any, last_loc: Any, free: Any, out: Any,
               _bs: int, page: int) -> None:
        paged.alloc_extend_naive(prefix_lens, seq_lens, last_loc, free, out, page, out.device)

    def decode(seq_lens: Any, last_loc: Any, free: Any, out: Any, _bs: int, page: int) -> None:
        n = common.get_num_new_pages(seq_lens=seq_lens, page_size=page, decode=True)
        paged.alloc_decode_naive(seq_lens, last_loc, free, out, page, n)

    sub.alloc_extend_kernel = _Launch(extend)
    sub.alloc_decode_kernel = _Launch(decode)


def _mamba_params(mods: dict[str, Any]) -> Any:
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=64, n_groups=1,
                                    num_heads=2, head_dim=32, state_size=8, conv_kernel=4)
    return Mamba2CacheParams(shape=shape, layers=[2])


class SGLangOps:
    """The same op streams on SGLang's unified hybrid allocator (CPU), with a
    request-to-token table as its scheduler keeps one."""

    def __init__(self, mods: dict[str, Any], window: int, state: bool,
                 decode_batch: int) -> None:
        import torch

        self.torch = torch
        self.window = window
        pool = mods["unified_memory_pool"]
        geometry: dict[str, Any] = dict(
            device="cpu", kv_cache_dtype=torch.bfloat16, head_num=1, head_dim=8,
            v_head_dim=8, swa_head_num=1, swa_head_dim=8, swa_v_head_dim=8,
            page_size=PAGE, start_layer=0, end_layer=3 if state else 2,
            swa_attention_layer_ids=[0], full_attention_layer_ids=[1],
            full_max_total_num_tokens=1 << 21, swa_max_total_num_tokens=1 << 20,
            enable_memory_saver=False, need_sort=False)
        self.mamba: Any = None  # the state-slot allocator (three-band)
        self.slots: dict[int, Any] = {}  # table row -> its state slot
        if state:
            bundle = pool.init_unified_mamba_swa_pools(
                **geometry, mamba_layer_ids=[2], mamba2_cache_params=_mamba_params(mods),
                max_mamba_cache_size=MAX_REQUESTS, model_context_len=MAX_CONTEXT,
                extra_max_context_len=0, max_num_reqs=MAX_REQUESTS,
                enable_mamba_extra_buffer=False, enable_mamba_extra_buffer_lazy=False,
                disable_overlap_schedule=True, sliding_window_size=window)
            self.mamba = bundle.req_to_token_pool.mamba_allocator
        else:
            bundle = pool.init_unified_swa_pools(**geometry)
        self.alloc = bundle.token_to_kv_pool_allocator
        self.last_loc = mods["allocation"].get_last_loc_torch
        self.table = torch.zeros((MAX_REQUESTS, MAX_CONTEXT), dtype=torch.int64)
        self.lens = torch.zeros(MAX_REQUESTS, dtype=torch.int64)
        self.freed = torch.zeros(MAX_REQUESTS, dtype=torch.int64)  # swa slots released
        self.free_rows = list(range(MAX_REQUESTS - 1, -1, -1))
        rows = [self._admit(running_prompt(i)) for i in range(decode_batch)]
        self.decoding = torch.tensor(rows, dtype=torch.int64)

    def _row(self) -> int:
        return self.free_rows.pop()

    def _extend(self, row: int, tokens: int) -> None:
        torch = self.torch
        idx = torch.tensor([row])
        prefix = self.lens[idx]
        seq = prefix + tokens
        last = self.last_loc(self.table, idx, prefix)
        out = self.alloc.alloc_extend(prefix, prefix, seq, seq, last, tokens)
        if out is None:
            raise RuntimeError("SGLang alloc_extend refused (pool too small)")
        start = int(prefix)
        if self.mamba is not None and start == 0:
            slot = self.mamba.alloc(1)  # as HybridReqToTokenPool.alloc for a new request
            if slot is None:
                raise RuntimeError("SGLang mamba slot refused (pool too small)")
            self.slots[row] = slot
        self.table[row, start:start + tokens] = out
        self.lens[row] = start + tokens

    def _trim(self, row: int) -> None:
        end = max(0, (int(self.lens[row]) - self.window) // PAGE * PAGE)
        begin = int(self.freed[row])
        if end > begin:
            self.alloc.free_swa(self.table[row, begin:end])
            self.freed[row] = end

    def _admit(self, tokens: int) -> int:
        row = self._row()
        self._extend(row, tokens)
        self._trim(row)
        return row

    def _release(self, row: int) -> None:
        self.alloc.free(self.table[row, :int(self.lens[row])])
        if row in self.slots:
            self.mamba.free(self.slots.pop(row))
        self.lens[row] = 0
        self.freed[row] = 0
        self.free_rows.append(row)

    def _decode_step(self, rows: Any) -> None:
        torch = self.torch
        seq = self.lens[rows]
        last = self.table[rows, seq - 1]
        nxt = seq + 1
        out = self.alloc.alloc_decode(nxt, nxt, last)
        if out is None:
            raise RuntimeError("SGLang alloc_decode refused (pool too small)")
        self.table[rows, seq] = out
        self.lens[rows] = nxt
        ends = torch.clamp((nxt - self.window) // PAGE * PAGE, min=0)
        crossed = (ends > self.freed[rows]).nonzero().flatten()
        if crossed.numel():
            slots = [self.table[int(rows[i]), int(self.freed[rows[i]]):int(ends[i])]
                     for i in crossed.tolist()]
            self.alloc.free_swa(torch.cat(slots))
            self.freed[rows[crossed]] = ends[crossed]

    def decode(self, calls: int) -> float:
        t0 = time.thread_time()
        for _ in range(calls):
            self._decode_step(self.decoding)
        return (time.thread_time() - t0) / calls

    def trim(self, calls: int) -> float:
        spent = 0.0
        for _ in range(calls):
            row = self._row()
            self._extend(row, PROMPT)
            t0 = time.thread_time()
            self._trim(row)
            spent += time.thread_time() - t0
            self._release(row)
        return spent / calls

    def capacity_fresh(self, calls: int) -> float:
        return self.capacity(calls)  # available_size() takes no demand

    def capacity_tuple(self, calls: int) -> float:
        return self.capacity(calls)  # available_size() takes no demand

    def capacity_pages(self, calls: int) -> float:
        return self.capacity(calls)  # available_size() takes no demand

    def capacity_pages_tuple(self, calls: int) -> float:
        return self.capacity(calls)  # available_size() takes no demand

    def capacity_first(self, calls: int) -> float:
        spent = 0.0
        for _ in range(calls):
            self._decode_step(self.decoding)
            t0 = time.thread_time()
            self.alloc.available_size()
            spent += time.thread_time() - t0
        return spent / calls

    def capacity(self, calls: int) -> float:
        available = self.alloc.available_size
        available()
        t0 = time.thread_time()
        for _ in range(calls):
            available()
        return (time.thread_time() - t0) / calls

    def prefill(self, calls: int) -> float:
        spent = 0.0
        for _ in range(calls):
            row = self._row()
            t0 = time.thread_time()
            self._extend(row, CHUNK)
            spent += time.thread_time() - t0
            self._trim(row)
            self._release(row)
        return spent / calls

    def release(self, calls: int) -> float:
        spent = 0.0
        rows = self.torch.tensor([0])
        for _ in range(calls):
            row = self._row()
            rows[0] = row
            self._extend(row, CHUNK)
            self._trim(row)
            for _ in range(PAGE):
                self._decode_step(rows)
            t0 = time.thread_time()
            self._release(row)
            spent += time.thread_time() - t0
        return spent / calls


# --- the table ---------------------------------------------------------------------------

# op label -> (method, calls per block, decode batch of the setup)
OPS = (("decode bs256", "decode", PAGE, 256), ("decode bs64", "decode", PAGE, 64),
       ("window trim (4,096-token prefill)", "trim", 8, BACKGROUND),
       ("capacity query (repeated)", "capacity", 2_000, BACKGROUND),
       ("capacity query (equal demand, new object)", "capacity_fresh", 2_000, BACKGROUND),
       ("capacity query (equal demand, new pages tuple)", "capacity_tuple", 2_000,
        BACKGROUND),
       ("capacity query (pages, same tuple, no Demand)", "capacity_pages", 2_000,
        BACKGROUND),
       ("capacity query (pages, new tuple, no Demand)", "capacity_pages_tuple", 2_000,
        BACKGROUND),
       ("capacity query (first after a decode step)", "capacity_first", 64, BACKGROUND),
       ("prefill (2,048-token chunk)", "prefill", 8, BACKGROUND),
       ("release (finished request)", "release", 8, BACKGROUND))


def alternate(blocks: dict[str, Callable[[], float]], repeats: int,
              fallible: str | None = None) -> tuple[dict[str, float], str | None]:
    """Run every block once as warm-up, then ``repeats`` times in turn: the median of
    each block's seconds per call, and the error of the ``fallible`` block (dropped from
    then on) if it raised."""
    failed = None
    seen: dict[str, list[float]] = {name: [] for name in blocks}
    for turn in range(repeats + 1):
        for name, run in list(blocks.items()):
            try:
                spent = run()
            except Exception as exc:
                if name != fallible:
                    raise
                failed = f"{type(exc).__name__}: {str(exc)[:200]}"
                del blocks[name], seen[name]
                continue
            if turn:
                seen[name].append(spent)
    return {name: statistics.median(v) for name, v in seen.items()}, failed


def _fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:.2f}"


def _ratio(a: float, b: float | None) -> str:
    return "-" if b is None else f"{a / b:.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 repeat of each block, fewer calls")
    parser.add_argument("--profile", choices=sorted({m for _, m, _, _ in OPS}),
                        help="instead of the table: cProfile of the kvchain side of one op "
                             "(its timed calls only), per chain, cache off and on")
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed blocks of each side per op (the median is reported; "
                             "default 7, 1 with --quick)")
    parser.add_argument("--ops", default="",
                        help="comma-separated methods of the ops to run (e.g. "
                             "capacity_first,capacity_tuple; default every op)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    known = {m for _, m, _, _ in OPS}
    only = {m for m in args.ops.split(",") if m}
    if only - known:
        parser.error(f"--ops: unknown {sorted(only - known)}; known {sorted(known)}")
    repeats = 1 if args.quick else args.repeats
    if args.profile:
        profile_op(args.profile, repeats)
        return
    mods, notes = load_sglang()
    for note in notes:
        print(f"note: {note}")
    print(f"us per call (thread CPU, median of {repeats} alternating blocks); ratio = "
          f"kvchain / SGLang (issue 20's target: <= {TARGET}x)")
    print("| chain | op | kvchain cache off | kvchain cache on | SGLang | off / SGLang | "
          "on / SGLang |")
    print("|---|---|---:|---:|---:|---:|---:|")
    over: list[str] = []  # the cells above the target
    for label, model in CATALOG_SHAPES:
        window, state = window_of(model), has_state(model)
        for op, method, calls, batch in OPS:
            if only and method not in only:
                continue
            if args.quick:
                calls = max(1, calls // 8)
            blocks: dict[str, Callable[[], float]] = {}
            for cache in (False, True):
                ops_kv = KvchainOps(model, cache, batch)
                blocks[f"kv{cache}"] = _bind(getattr(ops_kv, method), calls)
            blocked = None
            if mods is not None:
                try:
                    ops_sgl = SGLangOps(mods, window, state, batch)
                    blocks["sgl"] = _bind(getattr(ops_sgl, method), calls)
                except Exception as exc:
                    blocked = f"{type(exc).__name__}: {str(exc)[:200]}"
            got, failed = alternate(blocks, repeats, fallible="sgl")
            blocked = blocked or failed
            off, on, sgl = got["kvFalse"], got["kvTrue"], got.get("sgl")
            print(f"| {label} | {op} | {_fmt(off)} | {_fmt(on)} | {_fmt(sgl)} | "
                  f"{_ratio(off, sgl)} | {_ratio(on, sgl)} |")
            if blocked is not None:
                print(f"note: SGLang side of '{label} / {op}' failed: {blocked}")
            if sgl is not None:
                over += [f"{label} / {op} / cache {name}: {kv / sgl:.2f}x"
                         for name, kv in (("off", off), ("on", on)) if kv / sgl > TARGET]
    if mods is not None:
        ran = len(only) if only else len(OPS)
        print(f"over the {TARGET}x target: {len(over)} of {2 * ran * len(CATALOG_SHAPES)}"
              f" cells" + "".join(f"\n  {cell}" for cell in over))


def profile_op(method: str, repeats: int, top: int = 25) -> None:
    """Print cProfile's statistics of the kvchain side of op ``method`` (its timed calls
    only: what the table's kvchain columns measure, plus the profiler's own cost of
    about 1 us a call), per chain and cache setting: ``repeats`` blocks after one
    unprofiled block of warm-up, the ``top`` kvchain functions by cumulative time, each
    with its calls, own and cumulative microseconds per op (profiled time: cProfile adds
    about 0.1-0.5 us to every call it counts, so shares, not absolutes, carry over)."""
    label, calls, batch = next((op, c, b) for op, m, c, b in OPS if m == method)
    for chain_label, model in CATALOG_SHAPES:
        for cache in (False, True):
            ops_kv = KvchainOps(model, cache, batch)
            run = getattr(ops_kv, method)
            run(calls)
            ops_kv.profile = prof = cProfile.Profile()
            spent = statistics.median(run(calls) for _ in range(repeats))
            print(f"## {chain_label} / {label} / cache {'on' if cache else 'off'}: "
                  f"{spent * 1e6:.2f} us per call under the profiler, "
                  f"{repeats * calls} calls")
            ops = repeats * calls
            rows = [(ct, tt, nc, f"{file.split('/src/', 1)[-1]}:{line}({name})")
                    for (file, line, name), (_cc, nc, tt, ct, _callers)
                    in pstats.Stats(prof).stats.items()  # type: ignore[attr-defined]
                    if "kvchain" in file]
            print("| function | calls per op | own us per op | cumulative us per op |")
            print("|---|---:|---:|---:|")
            for ct, tt, nc, where in sorted(rows, reverse=True)[:top]:
                print(f"| {where} | {nc / ops:.1f} | {tt / ops * 1e6:.2f} | "
                      f"{ct / ops * 1e6:.2f} |")


def _bind(method: Callable[[int], float], calls: int) -> Callable[[], float]:
    return lambda: method(calls)


if __name__ == "__main__":
    main()
