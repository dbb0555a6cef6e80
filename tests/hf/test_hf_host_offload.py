"""A model's pages offloaded to the host tier and loaded back generate the same tokens.

Workload (every family of ``families.py``): request 0 (6 prompt tokens, 3 new) arrives at
step 0, request 1 (13 prompt tokens, ``NEW`` new) at step 1, both on a
:class:`kvchain.hf.ChainEngine` (4-token pages, 8-token prefill chunks). The engine steps
until request 0 has finished (its pages released: holes in every band, nearer each band's
anchor than request 1's pages, since request 0 took its pages first) and request 1 has
generated ``AT`` tokens. Then, between two steps:

1. every page request 1 holds in every band is copied to a host buffer
   (:func:`kvchain.cache.host_copy.offload_request`);
2. its device pages are overwritten with garbage (standard-normal fp32 bytes, the scale of
   real K/V and state, so a page left behind is wrong without being NaN);
3. the chain compacts (``Chain.flush_idle``): request 1's pages move into request 0's holes,
   carrying the garbage: its virtual ids stay, its physical pages change;
4. the host copies are loaded back (:func:`~kvchain.cache.host_copy.load_back_request`)
   into the pages its tables name now, and generation continues.

Request 1's tokens must equal transformers' ``generate`` with its own cache, and its logits
must be bit-identical (CPU; within ``LOGIT_TOL`` on CUDA) to the same engine run without
steps 1, 2 and 4 (step 3 included, so both runs compute on identical pages). The planted
siblings show each check can fail: the same run without the load-back, a load-back that
skips one page of one class, and a load-back into the physical pages the request had
before the compaction all give other tokens.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kvchain.hf needs torch")
pytest.importorskip("transformers", reason="kvchain.hf needs transformers")

from kvchain.buffer import HostBuffer  # noqa: E402
from kvchain.cache.host_copy import (  # noqa: E402
    RequestHostCopy,
    free_host_copy,
    host_slots_needed,
    load_back_request,
    offload_request,
    request_pages,
)
from kvchain.errors import (  # noqa: E402
    BufferArgumentError,
    HostPoolFullError,
    StaleHostCopyError,
    UnknownRequestError,
)

from .families import FAMILIES, build_model  # noqa: E402
from .test_hf_equality import BUFFER, DEVICES, LOGIT_TOL, PAGE  # noqa: E402

# (request id, prompt tokens, new tokens, arrival step)
SHORT, LONG = (0, 6, 3, 0), (1, 13, 8, 1)
RID, NEW = LONG[0], LONG[2]
AT = 3  # request 1's generated tokens at the offload
# Weights' standard deviation: at the families' default (0.02) some families print one token
# over and over, which would prove little; 0.2 (examples/generate.py's INIT_STD) gives 5 to 8
# distinct tokens of 8 for five families. The tiny Gemma-3 stays near-constant at every
# spread tried (0.02 .. 1.0); 0.1 gives it 3 distinct tokens, two of them after the offload
# ([9, 93, 93, 93, 93, 92, 92, 92]); its bit-identical logits carry the proof there.
INIT_STD = {family: 0.2 for family in FAMILIES} | {"gemma-3": 0.1}
# Pages request 1 holds at the offload. It has 13 + AT - 1 = 15 tokens in the cache (the last
# token sampled is not yet computed): full attention ceil(15 / 4) = 4 pages; a window of
# W = 8 (or a local chunk of C = 8) for the next token, at position 15, reads tokens 8..15:
# pages 2 and 3 (pages 0 and 1 released, null entries); state: its one working slot.
HELD = {"full": 4, "window": 2, "local": 2, "state": 1}


def _prompts() -> dict[int, list[int]]:
    g = torch.Generator().manual_seed(1)
    return {rid: torch.randint(0, 96, (n,), generator=g).tolist() for rid, n, _, _ in (LONG,
                                                                                     SHORT)}


def _garbage(engine: Any, rid: int, seed: int = 0) -> None:
    """Overwrite every device page ``rid`` holds with standard-normal fp32 bytes."""
    rng = np.random.default_rng(seed)
    for band, (_, vids, _) in enumerate(request_pages(engine.kv, rid)):
        layout = engine.layout.bands[band]
        for page in engine.chain.translate(band, vids):
            noise = rng.standard_normal(layout.page_bytes // 4).astype(np.float32)
            engine.buffer.write_page(layout, int(page), noise.view(np.uint8))


def _physical(engine: Any, rid: int) -> list[list[int]]:
    return [engine.kv.reads.block_table([rid], band)[0].tolist()
            for band in range(engine.chain.num_bands)]


class _Offload:
    """What one run did at the offload point."""

    def __init__(self) -> None:
        self.copy: RequestHostCopy | None = None
        self.host: HostBuffer | None = None
        self.before: list[list[int]] = []
        self.after: list[list[int]] = []
        self.moved = 0


def _run(model: Any, family: str, prompts: dict[int, list[int]], mode: str,
         skip: str | None = None) -> tuple[Any, _Offload]:
    """One engine run; ``mode``: ``"none"`` (no offload; the compaction only), ``"load"``
    (offload, garbage, compaction, load-back), ``"no-load"`` (the same without the
    load-back), ``"stale"`` (the load-back into the pre-compaction physical pages).
    ``skip``: a band label whose last copied page the load-back leaves out."""
    from kvchain.hf import ChainEngine

    engine = ChainEngine(model, BUFFER[family], page_size=PAGE, chunk_size=8, audit=True)
    for rid, _, new, arrival in (SHORT, LONG):
        engine.add(rid, prompts[rid], new, arrival)
    while (engine.results[SHORT[0]].finished_step is None
           or len(engine.results[RID].tokens) < AT):
        engine.step()
    info = _Offload()
    info.before = _physical(engine, RID)
    if mode != "none":
        backend = "torch"  # pinned on CUDA, plain host memory on a CPU-only torch
        info.host = host = HostBuffer(engine.layout, host_slots_needed(engine.kv, RID),
                                      backend=backend)
        info.copy, fence = offload_request(engine.kv, engine.buffer, host, RID,
                                           after=engine.buffer.fence())
        fence.wait()
        _garbage(engine, RID)
    info.moved = engine.chain.flush_idle()
    info.after = _physical(engine, RID)
    if mode in ("load", "stale"):
        assert info.copy is not None and info.host is not None
        copy = info.copy
        if skip is not None:  # the planted defect: one page of one class left out
            copy = replace(copy, bands=tuple(
                replace(b, entries=b.entries[:-1], vids=b.vids[:-1], slots=b.slots[:-1])
                if b.label == skip else b for b in copy.bands))
        if mode == "stale":  # the planted defect: physical pages taken at the offload
            for part in copy.bands:
                pages = np.asarray(info.before[part.band], dtype=np.int64)[part.entries]
                info.host.to_device(engine.buffer, engine.layout.bands[part.band],
                                    part.slots, pages).wait()
        else:
            fence = load_back_request(engine.kv, engine.buffer, info.host, copy)
            free_host_copy(info.host, info.copy, after=fence)
    engine.run(max_steps=200)
    return engine, info


def _reference(model: Any, prompt: list[int]) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                         min_new_tokens=NEW, do_sample=False)
    return gen[0, len(prompt):].tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_offload_and_load_back_generate_the_same_tokens(family: str, device: str) -> None:
    model = build_model(family, device, init_std=INIT_STD[family])
    prompts = _prompts()
    ref = _reference(model, prompts[RID])
    assert len(set(ref)) >= 3, ref  # tokens that vary
    plain, _ = _run(model, family, prompts, "none")
    engine, info = _run(model, family, prompts, "load")
    assert plain.results[RID].tokens == ref
    assert engine.results[RID].tokens == ref
    ours, theirs = engine.results[RID].logits, plain.results[RID].logits
    assert len(ours) == len(theirs) == NEW
    if device == "cpu":  # the same computation on the same bytes: bit-identical
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    else:
        assert max(float((a - b).abs().max()) for a, b in zip(ours, theirs, strict=True)) \
            <= LOGIT_TOL
    # The copy held every page of every band (hand-derived HELD; and what the request
    # layer counts itself), and moved exactly their bytes both ways.
    assert info.copy is not None and info.host is not None
    labels = [b.label for b in engine.layout.bands]
    copied = [int(b.slots.size) for b in info.copy.bands]
    assert copied == [HELD[label] for label in labels]
    nbytes = sum(n * b.page_bytes for n, b in zip(copied, engine.layout.bands, strict=True))
    stats = info.host.stats
    assert stats.pages_to_host == stats.pages_to_device == info.copy.pages == sum(copied)
    assert stats.bytes_to_host == stats.bytes_to_device == info.copy.nbytes(info.host) == nbytes
    # The load-back landed in other physical pages than the ones copied: request 1's pages
    # moved into request 0's holes in some band (the state slot too, where there is one:
    # request 0 took slot 0 first).
    assert info.moved > 0
    assert info.after != info.before
    state = engine.kv.geom.state
    if state is not None:
        assert info.before[state] != info.after[state]
    for pool in (info.host.pool(label) for label in labels):  # every slot returned
        assert pool.held_count == 0
    info.host.audit()
    assert engine.kv.num_requests == 0
    assert engine.scheduler.counters.finished == 2


def test_without_the_load_back_the_tokens_differ() -> None:
    """The garbage reaches the model: without the load-back, request 1's tokens differ."""
    model = build_model("lara-mini", init_std=INIT_STD["lara-mini"])
    prompts = _prompts()
    engine, _ = _run(model, "lara-mini", prompts, "no-load")
    assert engine.results[RID].tokens[:AT] == _reference(model, prompts[RID])[:AT]
    assert engine.results[RID].tokens != _reference(model, prompts[RID])


@pytest.mark.parametrize("skip", ["state", "window", "full"])
def test_planted_defect_a_load_back_that_skips_one_page(skip: str) -> None:
    """lara-mini (state | window | full): a load-back that leaves out the last copied page
    of one class (the state slot; the newest window page; the newest full page, tokens
    12..14) leaves garbage there, and request 1's tokens differ from transformers'."""
    model = build_model("lara-mini", init_std=INIT_STD["lara-mini"])
    prompts = _prompts()
    ref = _reference(model, prompts[RID])
    engine, _ = _run(model, "lara-mini", prompts, "load", skip=skip)
    assert engine.results[RID].tokens[:AT] == ref[:AT]  # before the offload: equal
    assert engine.results[RID].tokens != ref


def test_planted_defect_a_load_back_into_the_old_physical_pages() -> None:
    """A load-back addressed by the physical pages of the offload (not translated after
    the compaction moved them) writes the right bytes to the wrong places: tokens differ."""
    model = build_model("lara-mini", init_std=INIT_STD["lara-mini"])
    prompts = _prompts()
    engine, info = _run(model, "lara-mini", prompts, "stale")
    assert all(b != a for b, a in zip(info.before, info.after, strict=True))  # every band
    assert engine.results[RID].tokens != _reference(model, prompts[RID])


def test_bad_host_copies_raise_and_change_nothing() -> None:
    from kvchain.hf import ChainEngine

    model = build_model("lara-mini", init_std=INIT_STD["lara-mini"])
    prompts = _prompts()
    engine = ChainEngine(model, BUFFER["lara-mini"], page_size=PAGE, chunk_size=8)
    engine.add(RID, prompts[RID], NEW)
    for _ in range(3):
        engine.step()
    need = host_slots_needed(engine.kv, RID)
    # A host pool one slot short: refused before any slot is taken.
    short = dict(need, full=need["full"] - 1)
    host = HostBuffer(engine.layout, short)
    with pytest.raises(HostPoolFullError) as info:
        offload_request(engine.kv, engine.buffer, host, RID)
    assert (info.value.label, info.value.wanted, info.value.free) == ("full", need["full"],
                                                                       need["full"] - 1)
    assert all(host.pool(label).held_count == 0 for label in short)
    assert host.stats.to_host_calls == 0
    # Offload, then let the request run on: its window released a page and its full table
    # grew, so the copy is stale and loading it back is refused with the bytes untouched.
    host = HostBuffer(engine.layout, need)
    copy, _ = offload_request(engine.kv, engine.buffer, host, RID)
    for _ in range(4):
        engine.step()
    before = engine.buffer.tensor.clone()
    with pytest.raises(StaleHostCopyError):
        load_back_request(engine.kv, engine.buffer, host, copy)
    assert torch.equal(engine.buffer.tensor, before) and host.stats.to_device_calls == 0
    with pytest.raises(StaleHostCopyError):  # a copy of another chain's band count
        load_back_request(engine.kv, engine.buffer, host, replace(copy, bands=copy.bands[:2]))
    free_host_copy(host, copy)
    with pytest.raises(BufferArgumentError):  # freed twice
        free_host_copy(host, copy)
    engine.run(max_steps=200)
    with pytest.raises(UnknownRequestError):  # the request is gone
        offload_request(engine.kv, engine.buffer, host, RID)
