"""The draft model's forwards in the cost model: k sequential draft decodes per speculative
step (its weights read k times, its own KV read), its prefill over the prompt in the first
forward; a draft that shares the target's KV (or none) is free. Exact values on a tiny
draft, derived by hand."""

from __future__ import annotations

import pytest

from kvchain.gpu import GPUSpec
from kvchain.model import DraftKind, with_draft
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl
from kvchain.model.spec import ModelSpec
from kvchain.sim.cost import DraftCostModel

KV = (TensorDecl("k", (2, 4), CacheDtype.BF16), TensorDecl("v", (2, 4), CacheDtype.BF16))
# One full layer, K and V [2 heads, 4] bf16: E = 32 B per token; 4 query heads (64 FLOPs
# per (query, key) pair: 2 x 4 x (4 + 4)); 1,000 dense parameters in 2,000 B.
DRAFT = ModelSpec("tiny-draft", (LayerCache(0, LifetimeClass.FULL, "gqa", KV),), 1, 8, 4,
                  1_000, 1_000, 2_000)
TARGET = ModelSpec("tiny-target", (LayerCache(0, LifetimeClass.FULL, "gqa", KV),), 1, 8, 4,
                   9_000, 9_000, 18_000)
SLOW_GPU = GPUSpec("toy", 10**9, 1e6, 1e4, "hand-made")  # 1 MFLOP/s, 10 kB/s
EXACT = {"mfu": 1.0, "mbu": 1.0}


def test_k_draft_decodes_read_the_weights_k_times() -> None:
    cost = DraftCostModel(DRAFT, SLOW_GPU, **EXACT)
    # One request at context 10 drafting k = 3: three forwards of one token, at contexts
    # 10, 11, 12. Each reads the 2,000 B of weights, its keys (s + 1 tokens x 32 B) and
    # writes one token (32 B): 2,384 + 2,416 + 2,448 = 7,248 B at 10 kB/s = 0.7248 s
    # (memory-bound: the FLOPs, 2,000 + 64 x 11 = 2,704 for the first, take 2.7 ms).
    assert cost.step_seconds([], [(10, 3)]) == pytest.approx(0.7248)
    # k = 1: the first forward only.
    assert cost.step_seconds([], [(10, 1)]) == pytest.approx(0.2384)


def test_the_draft_prefills_the_prompt_in_its_first_forward() -> None:
    cost = DraftCostModel(DRAFT, SLOW_GPU, **EXACT)
    # A 4-token chunk at 0 beside the decode at 10 (k = 3). Forward 1: weights 2,000 B
    # once, keys 4 x 32 (chunk) + 11 x 32 (decode), 5 tokens written x 32 = 2,640 B
    # (0.264 s; FLOPs 2 x 1,000 x 5 + 64 x (10 + 11) = 11,344: 11 ms). Forwards 2 and 3
    # as above: 0.2416 + 0.2448. Total 0.7504 s.
    assert cost.step_seconds([(4, 0)], [(10, 3)]) == pytest.approx(0.7504)
    # A prefill-only step: the draft computes the chunk once, 2,000 + 128 + 128 = 2,256 B.
    assert cost.step_seconds([(4, 0)], []) == pytest.approx(0.2256)
    assert cost.step_seconds([], []) == 0.0


def test_two_requests_share_each_forward() -> None:
    cost = DraftCostModel(DRAFT, SLOW_GPU, **EXACT)
    # Contexts 10 (k = 3) and 20 (k = 1): forward 1 holds both (2,000 + 32 x (11 + 21)
    # + 2 x 32 = 3,088 B), forwards 2 and 3 only the first (2,416 + 2,448): 7,952 B.
    assert cost.step_seconds([], [(10, 3), (20, 1)]) == pytest.approx(0.7952)


def test_only_a_draft_with_kv_of_its_own_is_charged() -> None:
    assert DraftCostModel.of(TARGET, SLOW_GPU) is None  # no draft
    shared = with_draft(TARGET, DRAFT, DraftKind.MTP_SHARED)
    assert DraftCostModel.of(shared, SLOW_GPU) is None  # reads the target's KV: free
    for kind in (DraftKind.MODEL, DraftKind.EAGLE, DraftKind.MTP):
        found = DraftCostModel.of(with_draft(TARGET, DRAFT, kind), SLOW_GPU, **EXACT)
        assert found is not None and found.cost.model is DRAFT
        assert found.step_seconds([], [(10, 1)]) == pytest.approx(0.2384)
