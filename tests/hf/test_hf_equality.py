"""Transformers models generating on the chain's bytes equal their own generation.

Each family (``families.py``) runs the same workload twice:

* **on the chain**: :class:`kvchain.hf.ChainEngine` - four requests of 6 to 19 prompt
  tokens arriving at steps 0, 0, 2 and 3, prefilled in chunks of 8 tokens, decoded
  together, finished and released, with the K/V in 4-token pages and the recurrent state
  in state slots of a buffer of a few KB, compacted between steps and by the planner;
* **reference**: ``model.generate`` with transformers' own cache, greedy, one request at a
  time.

Greedy tokens must be identical and the logits of every generated token equal within
``LOGIT_TOL`` (fp32; the two sides reduce in different orders: chunked vs whole prefill,
paged gather vs contiguous cache, batched vs single decode; observed differences are below
2e-7 on logits of magnitude ~0.3).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="kvchain.hf needs torch")
pytest.importorskip("transformers", reason="kvchain.hf needs transformers")

from kvchain.alloc.band import Band, PageMoves  # noqa: E402
from kvchain.model.layers import CacheDtype, LifetimeClass  # noqa: E402

from .families import FAMILIES, build_model  # noqa: E402

LOGIT_TOL = 1e-5
PAGE = 4
# (request id, prompt tokens, new tokens, arrival step)
WORKLOAD = ((0, 13, 5, 0), (1, 6, 7, 0), (2, 19, 4, 2), (3, 9, 6, 3))
# Buffer bytes per family, found by a sweep: gpt-oss at 5,500 B is tight enough that the
# planner itself compacts inside a take (no between-step flush); lara-mini (state | window
# FLOAT | full) at 12,000 B makes the planner relocate the float; the other families
# compact between steps (Chain.flush_idle every FLUSH_EVERY steps).
BUFFER = {"gpt-oss": 5_500, "gemma-3": 9_000, "llama-4": 9_000, "qwen3-next": 9_000,
          "nemotron-h": 9_000, "lara-mini": 12_000}
FLUSH_EVERY = 3
FLUSH = {family: FLUSH_EVERY for family in FAMILIES} | {"gpt-oss": None}

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))]


def _prompts(seed: int = 1) -> dict[int, list[int]]:
    g = torch.Generator().manual_seed(seed)
    return {rid: torch.randint(0, 96, (n,), generator=g).tolist() for rid, n, _, _ in WORKLOAD}


def _run_chain(model: Any, family: str, prompts: dict[int, list[int]], **kw: Any) -> Any:
    from kvchain.hf import ChainEngine

    engine = ChainEngine(model, BUFFER[family], page_size=PAGE, chunk_size=8,
                         flush_every=FLUSH[family], **kw)
    for rid, _, new, arrival in WORKLOAD:
        engine.add(rid, prompts[rid], new, arrival)
    engine.run(max_steps=200)
    return engine


def _reference(model: Any, prompts: dict[int, list[int]]) -> dict[int, tuple[list[int], Any]]:
    out = {}
    for rid, n, new, _ in WORKLOAD:
        ids = torch.tensor([prompts[rid]], device=model.device)
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
        out[rid] = (gen.sequences[0, n:].tolist(), torch.cat(gen.logits).float().cpu())
    return out


def _worst_logit_gap(engine: Any, ref: dict[int, tuple[list[int], Any]]) -> float:
    worst = 0.0
    for rid, (_, logits) in ref.items():
        mine = torch.stack(engine.results[rid].logits)
        if mine.shape != logits.shape:
            return float("inf")
        worst = max(worst, float((mine - logits).abs().max()))
    return worst


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_generation_on_the_chain_equals_transformers(family: str, device: str) -> None:
    model = build_model(family, device)
    prompts = _prompts()
    engine = _run_chain(model, family, prompts, audit=True)
    ref = _reference(model, prompts)
    for rid, _, new, _ in WORKLOAD:
        assert len(engine.results[rid].tokens) == new
        assert engine.results[rid].tokens == ref[rid][0], f"request {rid}"
    assert _worst_logit_gap(engine, ref) <= LOGIT_TOL
    stats = engine.chain.stats
    assert stats.compactions > 0 and stats.pages_copied > 0  # pages moved under the model
    if family == "lara-mini":
        assert stats.relocations > 0  # the window float moved while requests held pages
    assert engine.scheduler.counters.finished == len(WORKLOAD)
    assert engine.kv.num_requests == 0  # every page released
    for band in range(engine.chain.num_bands):  # only the null pages stay bound
        assert engine.chain.bound_pages(band) == engine.layout.bands[band].reserved_pages


def test_planted_defect_stale_table_after_relocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relocation that copies the pages but leaves ``v2p`` pointing at the old places
    (the page table not updated) must break equality; the unpatched run passes above."""
    original = Band.apply_moves

    def stale(self: Band, moves: PageMoves) -> None:
        vids = self.p2v[moves.src].copy()
        original(self, moves)
        if moves.packed:
            self.v2p[vids] = moves.src  # the defect: tables still name the old pages

    monkeypatch.setattr(Band, "apply_moves", stale)
    model = build_model("lara-mini")
    prompts = _prompts()
    engine = _run_chain(model, "lara-mini", prompts)  # no audit: the model must notice
    assert engine.chain.stats.relocations > 0
    ref = _reference(model, prompts)
    same_tokens = all(engine.results[rid].tokens == ref[rid][0] for rid in ref)
    assert not same_tokens or _worst_logit_gap(engine, ref) > LOGIT_TOL


def test_layer_caches_from_the_model() -> None:
    from kvchain.hf import model_layer_caches

    # Qwen3-Next Gated DeltaNet, transformers' layout: conv (conv_dim, K) with
    # conv_dim = 2 * k_heads * k_dim + v_heads * v_dim = 2 * 2 * 8 + 4 * 8 = 64, K = 4;
    # recurrent (v_heads, k_dim, v_dim) = (4, 8, 8). Full attention: (kv_heads, dim).
    layers = model_layer_caches(build_model("qwen3-next"))
    assert [(x.index, x.lifetime) for x in layers] == [(0, LifetimeClass.STATE),
                                                       (1, LifetimeClass.FULL)]
    assert [(t.name, t.shape, t.dtype) for t in layers[0].tensors] == [
        ("conv", (64, 4), CacheDtype.FP32), ("recurrent", (4, 8, 8), CacheDtype.FP32)]
    assert [(t.name, t.shape) for t in layers[1].tensors] == [("k", (2, 8)), ("v", (2, 8))]
    # Nemotron-H (kvchain's loader refuses its to_dict(): lifetimes from layer_types):
    # Mamba-2 conv_dim = heads * head_dim + 2 * n_groups * d_state = 32 + 2 * 2 * 8 = 64;
    # ssm (heads, head_dim, d_state) = (4, 8, 8); MLP layers 1 and 3 keep nothing.
    layers = model_layer_caches(build_model("nemotron-h"))
    assert [(x.index, x.lifetime) for x in layers] == [(0, LifetimeClass.STATE),
                                                       (2, LifetimeClass.FULL)]
    assert [t.shape for t in layers[0].tensors] == [(64, 4), (4, 8, 8)]
    # Windows: gpt-oss sliding W = 8; Llama-4 chunked-local C = 8.
    assert [(x.lifetime, x.window) for x in model_layer_caches(build_model("gpt-oss"))] == [
        (LifetimeClass.WINDOW, 8), (LifetimeClass.FULL, None)]
    assert [(x.lifetime, x.window) for x in model_layer_caches(build_model("llama-4"))] == [
        (LifetimeClass.LOCAL, 8), (LifetimeClass.FULL, None)]


def test_moves_wait_for_the_last_forward() -> None:
    """With fences that stay pending until waited on (a GPU stream still running the last
    forward), every copy the chain makes first waits on that fence: moves happen, the
    waits are counted, and the tokens still equal transformers'."""
    from kvchain.buffer.base import ManualFence

    model = build_model("lara-mini")
    prompts = _prompts()
    fences: list[ManualFence] = []

    def pending() -> ManualFence:
        fences.append(ManualFence())
        return fences[-1]

    from kvchain.hf import ChainEngine

    engine = ChainEngine(model, BUFFER["lara-mini"], page_size=PAGE, chunk_size=8,
                         flush_every=FLUSH_EVERY, audit=True)
    engine.buffer.fence = pending  # type: ignore[method-assign]
    for rid, _, new, arrival in WORKLOAD:
        engine.add(rid, prompts[rid], new, arrival)
    engine.run(max_steps=200)
    stats = engine.chain.stats
    assert len(fences) == engine.forwards  # one fence registered per forward
    assert stats.pages_copied > 0 and stats.relocations > 0
    assert stats.fence_waits > 0 and sum(f.waits for f in fences) == stats.fence_waits
    ref = _reference(model, prompts)
    assert all(engine.results[rid].tokens == ref[rid][0] for rid in ref)
    assert _worst_logit_gap(engine, ref) <= LOGIT_TOL


def test_a_request_that_can_never_fit_says_why() -> None:
    """A request too long for the chain was left with no token and no word (the scheduler
    rejects it at arrival); its result now carries the rejection's reason. The other
    request still generates. gpt-oss at 5,500 B holds the 19-token workload requests but
    not a 240-token prompt (within the tiny model's 256-token context): its full pages
    alone need ceil((240 + 3 - 1) / 4) = 61, of 512 B each (4 tokens x 128 B), 31,232 B."""
    from kvchain.hf import ChainEngine

    model = build_model("gpt-oss")
    engine = ChainEngine(model, BUFFER["gpt-oss"], page_size=PAGE, chunk_size=8)
    engine.add(0, list(range(1, 20)), 3)
    engine.add(1, [5] * 240, 3)
    results = engine.run(max_steps=100)
    assert results[1].tokens == [] and results[1].rejected is not None
    assert "can never fit on the empty chain" in results[1].rejected
    assert len(results[0].tokens) == 3 and results[0].rejected is None
