"""copy_pages: gather-then-scatter semantics on overlapping pages, chunking, cycles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.buffer import NumpyBuffer, TorchBuffer, plan_copy
from kvchain.layout import Anchor

from .conftest import HAS_TORCH, buffer_bytes, byte_band, fill_pattern

PAGE = 8
NUM_PAGES = 20


def reference_copy(data: np.ndarray, grid_base: int, page_bytes: int,
                   src: list[int], dst: list[int]) -> np.ndarray:
    """Literal gather-then-scatter on a copy of ``data``."""
    out = data.copy()
    pages = [data[grid_base + s * page_bytes: grid_base + (s + 1) * page_bytes].copy()
             for s in src]
    for d, page in zip(dst, pages, strict=True):
        out[grid_base + d * page_bytes: grid_base + (d + 1) * page_bytes] = page
    return out


def run_copy(buf, band, src, dst):
    before = buffer_bytes(buf)
    buf.copy_pages(band, np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64))
    expected = reference_copy(before, band.grid_base, band.page_bytes, src, dst)
    np.testing.assert_array_equal(buffer_bytes(buf), expected)


GAPPY = [0, 1, 3, 4, 5, 8, 9, 12]


@pytest.mark.parametrize("shift", [1, 2, 3])
@pytest.mark.parametrize("chunk_pages", [1, 2, 3, 1000])
def test_slide_up_with_gaps(make_buffer, shift, chunk_pages):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * NUM_PAGES, chunk_bytes=chunk_pages * PAGE)
    fill_pattern(buf, band, NUM_PAGES)
    run_copy(buf, band, GAPPY, [s + shift for s in GAPPY])
    # page 15 = old page 12 after any shift of 3: spot check one concrete page
    if shift == 3:
        assert buf.stats.pages_copied == len(GAPPY)


@pytest.mark.parametrize("shift", [1, 2, 3])
@pytest.mark.parametrize("chunk_pages", [1, 2, 3, 1000])
def test_slide_down_with_gaps(make_buffer, shift, chunk_pages):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * NUM_PAGES, chunk_bytes=chunk_pages * PAGE)
    fill_pattern(buf, band, NUM_PAGES)
    src = [s + 3 for s in GAPPY]
    run_copy(buf, band, src, [s - shift for s in src])


def test_slide_concrete_bytes():
    """Pages 0, 1, 3 slide up by 1: page 1 gets old page 0, page 2 old page 1, page 4 old
    page 3; page 0 and page 3 keep their bytes."""
    band = byte_band(4)
    buf = NumpyBuffer(4 * 6)
    for j in range(6):
        buf.write_page(band, j, bytes([j] * 4))
    buf.copy_pages(band, np.array([0, 1, 3]), np.array([1, 2, 4]))
    assert [int(buf.read_page(band, j)[0]) for j in range(6)] == [0, 0, 1, 3, 3, 5]
    assert buf.stats.pages_copied == 3
    assert buf.stats.bytes_copied == 12
    assert buf.stats.copy_calls == 1


def test_high_band_grid_base(make_buffer):
    """A HIGH END's grid starts at ``B mod page_bytes``: 100 mod 8 = 4, 12 pages."""
    band = byte_band(8, grid_base=4, anchor=Anchor.HIGH)
    buf = make_buffer(100)
    fill_pattern(buf, band, 12)
    run_copy(buf, band, [10, 11, 7], [9, 10, 11])
    np.testing.assert_array_equal(buffer_bytes(buf)[:4], np.zeros(4, dtype=np.uint8))


@pytest.mark.parametrize("chunk_pages", [1, 2, 1000])
def test_cycles_swap_and_rotation(make_buffer, chunk_pages):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * NUM_PAGES, chunk_bytes=chunk_pages * PAGE)
    fill_pattern(buf, band, NUM_PAGES)
    # a swap, a 4-cycle with a tail feeding into it, and a self-copy
    src = [0, 1, 4, 5, 6, 7, 9, 12]
    dst = [1, 0, 5, 6, 7, 4, 4 + 10, 12]
    run_copy(buf, band, src, dst)


def test_plan_spills_one_page_per_cycle():
    plan = plan_copy(np.array([0, 1, 4, 5, 6, 7]), np.array([1, 0, 5, 6, 7, 4]), 1)
    assert sorted(plan.spill_pages.tolist()) == [0, 4]  # min-index copy of each cycle
    assert sum(c.src.size for c in plan.chunks) == 6


def test_plan_of_slide_needs_no_spill():
    src = np.arange(0, 1000)
    plan = plan_copy(src, src + 1, 64)
    assert plan.spill_pages.size == 0
    assert [c.src.size for c in plan.chunks] == [64] * 15 + [40]
    assert plan.chunks[0].dst[0] == 1000  # the highest page is written first


def test_plan_drops_self_copies():
    plan = plan_copy(np.array([3, 4]), np.array([3, 4]), 8)
    assert plan.chunks == ()


@settings(max_examples=60, deadline=None)
@given(data=st.data(), chunk_pages=st.integers(1, 5), n_pages=st.integers(1, 16))
def test_random_copies_match_gather_then_scatter(data, chunk_pages, n_pages):
    n = data.draw(st.integers(0, n_pages))
    dst = data.draw(st.permutations(range(n_pages)))[:n]
    src = data.draw(st.lists(st.integers(0, n_pages - 1), min_size=n, max_size=n))
    band = byte_band(4)
    bufs = [NumpyBuffer(4 * n_pages, chunk_bytes=4 * chunk_pages)]
    if HAS_TORCH:  # optional backend (the `torch` extra)
        bufs.append(TorchBuffer(4 * n_pages, "cpu", chunk_bytes=4 * chunk_pages))
    for buf in bufs:
        fill_pattern(buf, band, n_pages, seed=n)
        run_copy(buf, band, src, dst)


BAD_COPIES = [
    ([0, 1], [2], "as many sources"),
    ([0, 20], [1, 2], "source page 20 is outside"),
    ([0, 1], [2, -1], "destination page -1 is outside"),
    ([0, 1], [3, 3], "destination page 3 appears twice"),
    ([0.0, 1.0], [2, 3], "integers"),
    ([[0, 1]], [[2, 3]], "1-D"),
]


@pytest.mark.parametrize(("src", "dst", "message"), BAD_COPIES)
def test_bad_copy_changes_nothing(make_buffer, src, dst, message):
    from kvchain.errors import BufferArgumentError

    band = byte_band(PAGE)
    buf = make_buffer(PAGE * NUM_PAGES)
    fill_pattern(buf, band, NUM_PAGES)
    before = buffer_bytes(buf)
    with pytest.raises(BufferArgumentError, match=message):
        buf.copy_pages(band, np.array(src), np.array(dst))
    np.testing.assert_array_equal(buffer_bytes(buf), before)
    assert buf.stats.copy_calls == 0
    assert buf.stats.pages_copied == 0


def test_zero_pages(make_buffer):
    band = byte_band(PAGE)
    buf = make_buffer(PAGE * NUM_PAGES)
    fill_pattern(buf, band, NUM_PAGES)
    buf.zero_pages(band, np.array([2, 7]))
    assert not buf.read_page(band, 2).any()
    assert not buf.read_page(band, 7).any()
    assert buf.read_page(band, 3).any()
    assert buf.stats.pages_zeroed == 2
    from kvchain.errors import BufferArgumentError

    before = buffer_bytes(buf)
    with pytest.raises(BufferArgumentError):
        buf.zero_pages(band, np.array([1, NUM_PAGES]))
    np.testing.assert_array_equal(buffer_bytes(buf), before)
    assert buf.stats.zero_calls == 1
