"""Variants of field cases F9 (a window that straddles pages) and F7 (all layers windowed)
at other page sizes and with speculative decoding (docs/field-cases.md), run through the
field-case harness (every invariant after every step).

Page counts by hand: the layout's fewest window pages at ``W`` tokens are
``ceil((W - 1) / P) + 1``; with ``k`` drafts a decode's window holds ``W + k`` tokens,
``ceil((W + k - 1) / P) + 1`` pages (the window slack).
"""

from __future__ import annotations

import pytest
from tests.cases.helpers import make_scheduler, run_to_completion, window_class

from kvchain.alloc.chain import Chain
from kvchain.errors import BufferTooSmallError
from kvchain.layout import min_window_pages, plan_layout
from kvchain.requests.manager import KVManager
from kvchain.sched.request import EventKind, Request, StepBatch, StepOutcome
from kvchain.sched.scheduler import Scheduler

W = 32  # F9's window
E = 1_000  # bytes per token


@pytest.mark.parametrize(("page", "pages"), [
    (16, 3),  # ceil(31 / 16) + 1: at length 32 the window [1, 32] spans pages 0, 1 and 2
    (31, 2),  # ceil(31 / 31) + 1: tokens 30..39 read [t - 31, t] on pages 0 and 1
    (33, 2),  # ceil(31 / 33) + 1: pages 0 (tokens 0..32) and 1 (33..65)
    (64, 2),  # ceil(31 / 64) + 1: one page holds the window but it may start anywhere
])
def test_f9_other_page_sizes_smallest_buffer_runs(page: int, pages: int) -> None:
    assert min_window_pages(W, page) == pages
    classes = (window_class(E, W),)
    buffer = (pages + 1) * page * E  # the minimum + the null page
    with pytest.raises(BufferTooSmallError) as info:
        plan_layout(classes, buffer - 1, page)
    assert info.value.needed_bytes == buffer
    sched = make_scheduler(classes, buffer, page)
    result = run_to_completion(sched, [Request(0, 30, 10)])
    assert result.kinds(EventKind.FINISHED) == [0]
    # (30, 10) holds 39 tokens at its last decode: [8, 39] reads at most `pages` pages
    assert result.peak_pages[0] == [min(pages, -(-39 // page))]


class _Accept:
    """Every step one second; the verify accepts ``a`` drafts of each decode."""

    def __init__(self, a: int) -> None:
        self.step_s, self.a = 1.0, a

    def run(self, batch: StepBatch) -> StepOutcome:
        return StepOutcome(1.0, accepted={d.rid: min(self.a, d.drafts) for d in batch.decodes})


@pytest.mark.parametrize("accepted", [0, 3])
def test_f9_with_three_drafts_needs_the_slack_page(accepted: int) -> None:
    # P = 32, k = 3: a decode's window holds W + k = 35 tokens, up to ceil(34 / 32) + 1 =
    # 3 pages (at s = 61 the decode computes 61..64 and reads [30, 64]: pages 0, 1, 2).
    # On the chain of the plain minimum (2 pages + the null page) a request (30, 60),
    # which reaches s = 61, can never fit: rejected at once, while (1, 20) (its tokens
    # stay below 24: page 0 only) runs; with 3 pages + the null page both finish.
    classes = (window_class(E, W),)
    page_bytes = 32 * E
    assert min_window_pages(W + 3, 32) == 3
    small = Scheduler(KVManager(Chain(plan_layout(classes, 3 * page_bytes, 32)),
                                spec_tokens=3))
    result = run_to_completion(small, [Request(0, 30, 60), Request(1, 1, 20)],
                               driver=_Accept(accepted))  # type: ignore[arg-type]
    assert small.counters.rejected == 1 and result.kinds(EventKind.FINISHED) == [1]
    sched = Scheduler(KVManager(Chain(plan_layout(classes, 4 * page_bytes, 32)),
                                spec_tokens=3))
    result = run_to_completion(sched, [Request(0, 30, 60), Request(1, 1, 20)],
                               driver=_Accept(accepted))  # type: ignore[arg-type]
    assert sorted(result.kinds(EventKind.FINISHED)) == [0, 1]
    assert sched.counters.retractions == 0 and sched.counters.divergences == 0
    assert max(p[0] for p in result.peak_pages.values()) <= 3


@pytest.mark.parametrize("page", [1, 8, 16, 48])
def test_f7_all_windowed_two_requests_at_other_page_sizes(page: int) -> None:
    # F7's classes (E_win = 131,072 B, W = 48) in a buffer of 10 windows' worth of bytes
    # at the page size: R1 (100, 200) and R2 (64, 8) both finish, none retracted, and no
    # request ever holds more than ceil((W - 1 + chunk) / P) + 1 pages for its chunk.
    classes = (window_class(131_072, 48),)
    buffer = 10 * 48 * 131_072 + 131_072 * page  # + the null page
    sched = make_scheduler(classes, buffer, page)
    result = run_to_completion(sched, [Request(0, 100, 200)], arrivals=[(3, Request(1, 64, 8))])
    assert sorted(result.kinds(EventKind.FINISHED)) == [0, 1]
    assert sched.counters.retractions == 0
    chunk = sched.config.chunk_size
    for rid, prompt in ((0, 100), (1, 64)):
        assert result.peak_pages[rid][0] <= min_window_pages(48 + min(chunk, prompt), page)
