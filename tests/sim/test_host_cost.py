"""Host <-> device transfer time, its overlap with the forward, and what a host hit saves a
lone request's TTFT: values derived by hand."""

from __future__ import annotations

import pytest

from kvchain.errors import ConfigError, CostModelError
from kvchain.gpu import (
    KNOWN_GPUS,
    NVLINK_C2C,
    PCIE4_X16,
    PCIE5_X16,
    GPUSpec,
    HostLink,
    get_gpu,
)
from kvchain.model.layers import CacheDtype, LayerCache, LifetimeClass, TensorDecl
from kvchain.model.spec import ModelSpec
from kvchain.sim.cost import (
    DEFAULT_HOST_LINK_EFFICIENCY,
    GPUCostModel,
    LoadOverlap,
    host_hit_ttft,
    host_transfer_time,
    overlapped_time,
)

GiB = 2**30


def test_links_of_the_known_gpus():
    # Datasheets print both directions: PCIe Gen4 64 GB/s, Gen5 128 GB/s, C2C 900 GB/s.
    assert (PCIE4_X16.bytes_per_s, PCIE5_X16.bytes_per_s, NVLINK_C2C.bytes_per_s) == \
        (32e9, 64e9, 450e9)
    links = {g.name: g.host_link for g in KNOWN_GPUS}
    assert links == {"A100-SXM4-80GB": PCIE4_X16, "H100-SXM5-80GB": PCIE5_X16,
                     "H200-SXM-141GB": PCIE5_X16, "B200-SXM-180GB": PCIE5_X16}
    with pytest.raises(ConfigError, match="positive"):
        HostLink("x", 0.0, "")
    with pytest.raises(ConfigError, match="name"):
        HostLink("", 1.0, "")


def test_transfer_time_by_hand():
    assert DEFAULT_HOST_LINK_EFFICIENCY == 0.8
    # 1 GiB over PCIe 5.0 x16 at 0.8: 1,073,741,824 / (64e9 x 0.8) = 20.97152 ms.
    assert host_transfer_time(GiB, get_gpu("h200")) == pytest.approx(0.02097152)
    # over NVLink-C2C: 1,073,741,824 / 360e9 = 2.98262 ms (7.03x faster: 450 / 64).
    c2c = GPUSpec("GH200-toy", 10**9, 1e15, 4e12, "test", host_link=NVLINK_C2C)
    assert host_transfer_time(GiB, c2c) == pytest.approx(GiB / 360e9)
    assert host_transfer_time(0, c2c) == 0.0
    assert host_transfer_time(64_000, get_gpu("a100"), efficiency=1.0) == pytest.approx(2e-6)
    with pytest.raises(CostModelError):
        host_transfer_time(-1, c2c)
    with pytest.raises(ConfigError, match="efficiency"):
        host_transfer_time(1, c2c, efficiency=0.0)
    with pytest.raises(ConfigError, match="no host link"):
        host_transfer_time(1, GPUSpec("bare", 1, 1.0, 1.0, ""))


def test_overlap_by_hand():
    # 4 layers, load 8 and forward 4: a = 2, c = 1 -> 2 + 3 x max(2, 1) + 1 = 9.
    assert overlapped_time(8.0, 4.0, 4) == pytest.approx(9.0)
    assert overlapped_time(8.0, 4.0, 4, LoadOverlap.NONE) == pytest.approx(12.0)
    # Load faster than compute: a = 0.5, c = 2 -> 0.5 + 3 x 2 + 2 = 8.5 (forward + a).
    assert overlapped_time(2.0, 8.0, 4) == pytest.approx(8.5)
    # One layer cannot overlap anything: load + forward.
    assert overlapped_time(8.0, 4.0, 1) == pytest.approx(12.0)
    assert overlapped_time(0.0, 4.0, 8) == pytest.approx(4.0)
    with pytest.raises(CostModelError):
        overlapped_time(1.0, 1.0, 0)
    with pytest.raises(CostModelError):
        overlapped_time(-1.0, 1.0, 2)


# Two full-attention layers, K and V [2, 4] bf16: E_full = 2 x 32 = 64 B per token; 4 query
# heads: 2 x 64 = 128 FLOPs per (query, key) pair; 1,000 params (2,000 FLOPs per token).
BF16 = CacheDtype.BF16
KV = (TensorDecl("k", (2, 4), BF16), TensorDecl("v", (2, 4), BF16))
MODEL = ModelSpec("tiny-full", (LayerCache(0, LifetimeClass.FULL, "gqa", KV),
                                LayerCache(1, LifetimeClass.FULL, "gqa", KV)),
                  2, 8, 4, 1_000, 1_000, 2_000)


def toy_gpu(link_bytes_per_s: float) -> GPUSpec:
    # 1 MFLOP/s and 1 GB/s of HBM: every prefill here is compute-bound.
    return GPUSpec("toy", 10**9, 1e6, 1e9, "hand-made",
                   host_link=HostLink("toy link", link_bytes_per_s, "hand-made"))


def test_host_hit_ttft_by_hand():
    cost = GPUCostModel(MODEL, toy_gpu(100_000.0), mfu=1.0, mbu=1.0, step_overhead_s=0.0)
    # Prompt 10 tokens, hit 8 (512 B: 8 tokens x 64 B).
    # Recompute: pairs 10 x 11 / 2 = 55; FLOPs 2,000 x 10 + 128 x 55 = 27,040 -> 27.04 ms.
    # Suffix 2 tokens at context 8: pairs 2 x 8 + 3 = 19; 4,000 + 128 x 19 = 6,432 -> 6.432 ms.
    # Load 512 B at 100 kB/s (efficiency 1) = 5.12 ms; 2 layers: a = 2.56, c = 3.216 ->
    # 2.56 + 3.216 + 3.216 = 8.992 ms; saved 27.04 - 8.992 = 18.048 ms.
    t = host_hit_ttft(cost, 10, 8, 512, efficiency=1.0)
    assert t.recompute_s == pytest.approx(0.02704)
    assert t.load_s == pytest.approx(0.00512)
    assert t.with_hit_s == pytest.approx(0.008992)
    assert t.saved_s == pytest.approx(0.018048)
    # Without layer-wise overlap: 5.12 + 6.432 = 11.552 ms; saved 15.488 ms.
    t = host_hit_ttft(cost, 10, 8, 512, efficiency=1.0, overlap=LoadOverlap.NONE)
    assert t.with_hit_s == pytest.approx(0.011552)
    assert t.saved_s == pytest.approx(0.015488)


def test_a_slow_link_makes_the_hit_cost_time():
    # Link 1 kB/s: load 0.512 s; a = 0.256, c = 0.003216 -> 0.256 + 0.256 + 0.003216 =
    # 0.515216 s against 0.02704 s of recompute: the hit costs 0.488176 s.
    cost = GPUCostModel(MODEL, toy_gpu(1_000.0), mfu=1.0, mbu=1.0, step_overhead_s=0.0)
    t = host_hit_ttft(cost, 10, 8, 512, efficiency=1.0)
    assert t.with_hit_s == pytest.approx(0.515216)
    assert t.saved_s == pytest.approx(-0.488176)


def test_overhead_is_not_overlapped():
    # Overhead 10 ms on both sides: recompute 37.04 ms; with the hit 10 + 8.992 = 18.992 ms.
    cost = GPUCostModel(MODEL, toy_gpu(100_000.0), mfu=1.0, mbu=1.0, step_overhead_s=0.01)
    t = host_hit_ttft(cost, 10, 8, 512, efficiency=1.0)
    assert t.recompute_s == pytest.approx(0.03704)
    assert t.with_hit_s == pytest.approx(0.018992)


def test_host_hit_refusals():
    cost = GPUCostModel(MODEL, toy_gpu(1.0), mfu=1.0, mbu=1.0, step_overhead_s=0.0)
    for prompt, hit in ((10, 0), (10, 10), (10, 11)):
        with pytest.raises(CostModelError, match="last prompt token"):
            host_hit_ttft(cost, prompt, hit, 1)
    with pytest.raises(CostModelError):
        host_hit_ttft(cost, 10, 8, -1)
