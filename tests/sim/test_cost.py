"""The roofline GPU cost model: exact values on tiny specs, regimes, caps, monotonicity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvchain.errors import ConfigError, CostModelError
from kvchain.gpu import GPUSpec, get_gpu
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl
from kvchain.model.spec import ModelSpec
from kvchain.sim.cost import (
    GPUCostModel,
    SequenceWork,
    StepWork,
    StepWorkBuilder,
    attention_flops_per_pair,
)

BF16, FP32 = CacheDtype.BF16, CacheDtype.FP32
FULL, WINDOW, LOCAL, STATE = (LifetimeClass.FULL, LifetimeClass.WINDOW, LifetimeClass.LOCAL,
                              LifetimeClass.STATE)


def kv(heads: int, dim: int, dtype: CacheDtype = BF16) -> tuple[TensorDecl, ...]:
    return (TensorDecl("k", (heads, dim), dtype), TensorDecl("v", (heads, dim), dtype))


def spec(layers, *, heads=4, total=1_000, active=1_000, weight_bytes=2_000, name="tiny"):
    return ModelSpec(name, tuple(layers), len(layers), 8, heads, total, active, weight_bytes)


# one full and one window layer (W = 4), K and V [2, 4] bf16: E_full = E_win = 32 B
TINY = spec([LayerCache(0, FULL, "gqa", kv(2, 4)),
             LayerCache(1, WINDOW, "gqa", kv(2, 4), window=4)])
SLOW_GPU = GPUSpec("toy", 10**9, 1e6, 1e4, "hand-made")  # 1 MFLOP/s, 10 kB/s
EXACT = {"mfu": 1.0, "mbu": 1.0, "step_overhead_s": 0.0}


def test_per_pair_flops():
    assert attention_flops_per_pair(TINY.layers[0], 4) == 2 * 4 * (4 + 4) == 64
    mimo = LayerCache(0, FULL, "gqa", (TensorDecl("k", (4, 192), BF16),
                                       TensorDecl("v", (4, 128), BF16)))
    assert attention_flops_per_pair(mimo, 8) == 2 * 8 * (192 + 128) == 5_120
    mla = LayerCache(0, FULL, "mla", (TensorDecl("latent", (576,), BF16),))
    assert attention_flops_per_pair(mla, 16) == 4 * 16 * 576


def test_decode_exact_memory_bound():
    cost = GPUCostModel(TINY, SLOW_GPU, **EXACT)
    work = cost.work_of([SequenceWork.decode(10)])
    assert work == StepWork(sequences=1, tokens=1, full_pairs=11, window_pairs=4,
                            full_kv_tokens=11, window_kv_tokens=4)
    parts = cost.breakdown(work)
    assert parts.flops == 2 * 1_000 + 64 * 11 + 64 * 4 == 2_960
    assert parts.bytes == 2_000 + 32 * 11 + 32 * 4 + 64 * 1 == 2_544
    assert parts.weight_bytes == 2_000
    assert parts.compute_s == pytest.approx(2_960 / 1e6)
    assert parts.memory_s == pytest.approx(0.2544)
    assert not parts.compute_bound
    assert cost.step_time(work) == pytest.approx(0.2544)


def test_efficiencies_and_overhead():
    cost = GPUCostModel(TINY, SLOW_GPU, mfu=0.5, mbu=0.8, step_overhead_s=0.01)
    work = cost.work_of([SequenceWork.decode(10)])
    assert cost.step_time(work) == pytest.approx(max(2_960 / 0.5e6, 2_544 / 8e3) + 0.01)
    assert cost.step_time(StepWork()) == 0.0  # an empty step costs nothing
    assert cost.breakdown(StepWork()).total_s == 0.0


def test_prefill_exact_compute_bound():
    cost = GPUCostModel(TINY, GPUSpec("toy", 10**9, 1e6, 1e6, "hand-made"), **EXACT)
    b = cost.builder()
    b.add_prefill(8, 0)
    work = b.build()
    # window pairs: positions 0..7 attend 1, 2, 3, 4, 4, 4, 4, 4 keys
    assert (work.full_pairs, work.window_pairs) == (36, 26)
    assert (work.full_kv_tokens, work.window_kv_tokens) == (8, 8)
    parts = cost.breakdown(work)
    assert parts.flops == 16_000 + 64 * 36 + 64 * 26 == 19_968
    assert parts.bytes == 2_000 + 32 * 8 + 32 * 8 + 64 * 8 == 3_024
    assert parts.compute_bound
    assert cost.step_time(work) == pytest.approx(0.019968)


def test_local_and_state_classes():
    model = spec([LayerCache(0, LOCAL, "chunked", kv(1, 2, FP32), window=8),
                  LayerCache(1, STATE, "mamba2", (TensorDecl("conv", (4, 3), FP32),
                                                  TensorDecl("ssm", (2, 2, 2), FP32)))],
                 heads=2)
    cost = GPUCostModel(model, SLOW_GPU, **EXACT)
    assert cost.flops_per_token == 2 * 1_000 + 4 * (12 + 8)
    b = cost.builder()
    b.add_prefill(5, 6)  # positions 6..10 attend 7, 8, 1, 2, 3 keys of the chunk C = 8
    work = b.build()
    assert (work.local_pairs, work.local_kv_tokens) == (21, 11)
    parts = cost.breakdown(work)
    assert parts.flops == 2_080 * 5 + 16 * 21
    # weights + local KV read (16 B x 11) + written (16 B x 5) + state read and write
    assert parts.bytes == 2_000 + 16 * 11 + 16 * 5 + 2 * 80


def test_moe_weights_touched():
    moe = spec([LayerCache(0, FULL, "gqa", kv(2, 4))], total=1_000, active=100)
    cost = GPUCostModel(moe, SLOW_GPU, **EXACT)
    assert cost.weight_bytes_read(0) == 0.0
    assert cost.weight_bytes_read(1) == pytest.approx(200.0)  # the active weights
    assert cost.weight_bytes_read(2) == pytest.approx(2_000 * (1 - 0.9**2))
    assert cost.weight_bytes_read(10_000) == pytest.approx(2_000.0)
    dense = GPUCostModel(TINY, SLOW_GPU, **EXACT)
    assert dense.weight_bytes_read(1) == dense.weight_bytes_read(64) == 2_000.0


LLAMA8B = spec([LayerCache(i, FULL, "gqa", kv(8, 128)) for i in range(32)], heads=32,
               total=8_030_000_000, active=8_030_000_000, weight_bytes=16_060_000_000,
               name="llama-3.1-8b-like")


def test_regimes_on_h100():
    cost = GPUCostModel(LLAMA8B, get_gpu("h100"))
    decode = cost.breakdown(cost.work_of([SequenceWork.decode(1_000)]))
    assert not decode.compute_bound
    # 16.06e9 B of weights + 131,072 B x (1,001 read + 1 written) at 0.7 x 3.35 TB/s
    assert decode.memory_s == pytest.approx((16.06e9 + 131_072 * 1_002) / (0.7 * 3.35e12))
    assert 0.0068 < decode.total_s < 0.0080
    prefill = cost.breakdown(cost.work_of([SequenceWork(8_192, 0)]))
    assert prefill.compute_bound
    assert prefill.flops == 2 * 8.03e9 * 8_192 + 32 * 16_384 * (8_192 * 8_193 // 2)


def test_window_cap_reduces_kv_read():
    window_model = spec([LayerCache(0, WINDOW, "swa", kv(2, 4), window=128)])
    full_model = spec([LayerCache(0, FULL, "gqa", kv(2, 4))])
    w = GPUCostModel(window_model, SLOW_GPU, **EXACT)
    f = GPUCostModel(full_model, SLOW_GPU, **EXACT)
    ww = w.work_of([SequenceWork.decode(10_000)])
    fw = f.work_of([SequenceWork.decode(10_000)])
    assert (ww.window_kv_tokens, fw.full_kv_tokens) == (128, 10_001)
    assert f.breakdown(fw).bytes - w.breakdown(ww).bytes == 32 * (10_001 - 128)
    assert w.step_time(ww) < f.step_time(fw)
    # below the window both read the same keys
    assert w.step_time(w.work_of([SequenceWork.decode(50)])) == \
        f.step_time(f.work_of([SequenceWork.decode(50)]))


@pytest.mark.parametrize("model", [LLAMA8B, spec(LLAMA8B.layers, heads=32,
                                                 total=8_030_000_000, active=1_000_000_000,
                                                 weight_bytes=16_060_000_000)])
def test_monotone_in_batch_size(model):
    cost = GPUCostModel(model, get_gpu("h200"))
    times = []
    for n in range(1, 257, 5):
        b = cost.builder()
        b.add_decodes(np.full(n, 2_000))
        times.append(cost.step_time(b.build()))
    assert all(a <= b for a, b in itertools.pairwise(times))
    assert times[-1] > times[0]


def test_vectorized_decodes_equal_loop():
    cost = GPUCostModel(spec([LayerCache(0, FULL, "gqa", kv(2, 4)),
                              LayerCache(1, LOCAL, "chunked", kv(2, 4), window=16)]),
                        SLOW_GPU)
    contexts = np.array([0, 1, 15, 16, 17, 300, 1_000])
    one, many = cost.builder(), cost.builder()
    for c in contexts:
        one.add_decode(int(c))
    many.add_decodes(contexts)
    assert one.build() == many.build()
    assert one.build().local_pairs == 1 + 2 + 16 + 1 + 2 + (300 % 16 + 1) + (1_000 % 16 + 1)


def brute(s: int, c: int, window: int, chunk: int) -> tuple[int, int, int]:
    positions = range(s, s + c)
    return (sum(p + 1 for p in positions), sum(min(p + 1, window) for p in positions),
            sum(p % chunk + 1 for p in positions))


@given(s=st.integers(0, 300), c=st.integers(1, 300), window=st.integers(1, 64),
       chunk=st.integers(1, 64))
def test_pair_formulas_match_brute_force(s, c, window, chunk):
    b1 = StepWorkBuilder(window, None)
    b2 = StepWorkBuilder(None, chunk)
    b1.add_prefill(c, s)
    b2.add_prefill(c, s)
    full, win, loc = brute(s, c, window, chunk)
    assert (b1.build().full_pairs, b1.build().window_pairs, b2.build().local_pairs) == \
        (full, win, loc)
    assert b1.build().window_kv_tokens == len(range(max(0, s - window + 1), s + c))
    assert b2.build().local_kv_tokens == s + c - (s // chunk) * chunk


def test_bad_input():
    with pytest.raises(CostModelError):
        StepWork(sequences=2, tokens=1)
    with pytest.raises(CostModelError):
        StepWork(tokens=1, full_pairs=-1)
    b = StepWorkBuilder(4, None)
    for call in (lambda: b.add_prefill(0, 5), lambda: b.add_prefill(3, -1),
                 lambda: b.add_decode(-1), lambda: b.add_decodes(np.array([3, -2]))):
        with pytest.raises(CostModelError):
            call()
    assert b.build() == StepWork()  # refused calls added nothing
    with pytest.raises(ConfigError):
        StepWorkBuilder(0, None)
    for kwargs in ({"mfu": 0.0}, {"mbu": 1.5}, {"step_overhead_s": -1.0},
                   {"mfu": float("nan")}):
        with pytest.raises(ConfigError):
            GPUCostModel(TINY, SLOW_GPU, **kwargs)
    with pytest.raises(ConfigError):
        GPUCostModel(spec(TINY.layers, total=10, active=20), SLOW_GPU)


def test_stepwork_sum():
    a = StepWork(1, 1, 11, 4, 0, 11, 4, 0)
    assert a + a == StepWork(2, 2, 22, 8, 0, 22, 8, 0)


@pytest.mark.parametrize(("model", "tp"), [("gpt-oss-120b", 1), ("llama-4-scout", 4),
                                           ("jet-nemotron-2b", 1), ("qwen3-8b", 1)])
@given(contexts=st.lists(st.integers(0, 200_000), min_size=1, max_size=40),
       steps=st.integers(1, 300))
def test_decode_run_times_equal_the_per_step_formula_bit_for_bit(model, tp, contexts, steps):
    """The fast-forward's clock (``decode_run`` + ``run_times``) gives each step exactly
    the float the per-step loop computes from a builder fed one ``add_decode`` per
    request: same integers, same float operations in the same order."""
    from kvchain.catalog.loader import load_model
    cost = GPUCostModel(load_model(model, tp=tp), get_gpu("h200"))
    run = cost.builder().decode_run(np.asarray(contexts), steps)
    times = cost.run_times(run)
    b = cost.builder()
    for j in range(steps):
        b.reset()
        for c in contexts:
            b.add_decode(c + j)
        assert run.step(j) == b.build()
        assert times[j] == cost.step_time(b.build())  # exact, not approximately


def test_decode_run_work_by_hand_and_refusals():
    # W = 4: contexts 2 and 9, two steps. Step 0: full pairs (2 + 1) + (9 + 1) = 13, window
    # min(3, 4) + min(10, 4) = 7; step 1: 15 and min(4, 4) + 4 = 8.
    run = StepWorkBuilder(window=4).decode_run(np.asarray([2, 9]), 2)
    assert run.full_pairs.tolist() == [13, 15] and run.window_pairs.tolist() == [7, 8]
    assert run.local_pairs.tolist() == [0, 0]
    # C = 4 (local): step 0 (2 mod 4) + 1 + (9 mod 4) + 1 = 3 + 2; step 1 at 3 and 10: 4 + 3.
    loc = StepWorkBuilder(local_chunk=4).decode_run(np.asarray([2, 9]), 2)
    assert loc.local_pairs.tolist() == [3 + 2, 4 + 3]
    with pytest.raises(CostModelError):
        StepWorkBuilder().decode_run(np.asarray([-1]), 1)
    with pytest.raises(CostModelError):
        StepWorkBuilder().decode_run(np.asarray([1]), 0)
    cost = GPUCostModel(TINY, SLOW_GPU, **EXACT)
    # a decode at context 10 costs 2,960 FLOPs (1 MFLOP/s: 2.96 ms) and moves 2,544 B
    # (10 kB/s: 0.2544 s, the bound) - the worked example above; at 11 one more full key:
    # 2,544 + 32 = 2,576 B.
    times = cost.run_times(cost.builder().decode_run(np.asarray([10]), 2))
    assert times.tolist() == [2_544 / 1e4, 2_576 / 1e4]
