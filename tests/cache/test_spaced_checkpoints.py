"""Spaced checkpoints under a budget (``--cache-points spaced``, the ``auto`` choice on a
state chain): a prompt of ``n`` whole pages keeps a checkpoint every ``K`` content-block
boundaries counted back from its last, ``K`` the least spacing that keeps it within
``C = max(2, min(B // (64 S), n E // S))`` checkpoints (buffer ``B`` bytes, state slot ``S``
bytes, full-attention pages of ``E`` bytes; :func:`spaced_budget`).

Real layouts, page P = 16 tokens, interval 512 tokens (32 pages), chunks of 8,192 tokens,
requests one after the other (tests/cache/test_junction_checkpoints.py's driver).
qwen3-next-80b-a3b: S = 39,518,208 (so 64 S = 2,529,165,312), E = 393,216 (full);
jet-nemotron-2b: S = 14,745,600 (64 S = 943,718,400), E = 32,768.
Hit lengths derived by hand in each test; each pattern has a sibling with the old
placement, which misses where spaced hits."""

from __future__ import annotations

import pytest

from kvchain.bands.policies import FullPolicy, StatePolicy, WindowPolicy
from kvchain.cache.radix import (
    CacheGeometry,
    ResumePolicy,
    resume_points,
    spaced_budget,
)
from kvchain.catalog.loader import load_model
from kvchain.errors import InvalidRequestError
from kvchain.layout import plan_layout

from .test_junction_checkpoints import scheduler, serve_one_by_one, tokens

P = 16
GIB = 1 << 30
SPACED = ResumePolicy.SPACED


def geom(model: str, buffer_bytes: int) -> CacheGeometry:
    return CacheGeometry.of(plan_layout(load_model(model).classes, buffer_bytes, P))


@pytest.mark.parametrize(("model", "buffer_bytes", "pages", "want"), [
    ("qwen3-next-80b-a3b", 16 * GIB, None, 6),  # 17,179,869,184 // 2,529,165,312 = 6 (6.79)
    ("qwen3-next-80b-a3b", 40 * GIB, None, 16),  # 42,949,672,960 // 2,529,165,312 = 16
    ("qwen3-next-80b-a3b", 4 * GIB, None, 2),   # 1 (1.70), raised to the two of ends
    ("jet-nemotron-2b", 16 * GIB, None, 18),    # 17,179,869,184 // 943,718,400 = 18 (18.2)
    # 500 pages: 500 x 393,216 = 196,608,000 B of pages // 39,518,208 = 4 (4.98) < 6, 16
    ("qwen3-next-80b-a3b", 16 * GIB, 500, 4),
    ("qwen3-next-80b-a3b", 40 * GIB, 500, 4),
    # 16,162 pages: 6,355,058,688 // 39,518,208 = 160 > 6: the buffer bound
    ("qwen3-next-80b-a3b", 16 * GIB, 16_162, 6),
    # 500 x 32,768 = 16,384,000 // 14,745,600 = 1, raised to 2; 5,000 pages: 11 (11.1)
    ("jet-nemotron-2b", 16 * GIB, 500, 2),
    ("jet-nemotron-2b", 16 * GIB, 5_000, 11),
])
def test_budget_from_the_bytes(model, buffer_bytes, pages, want):
    assert spaced_budget(geom(model, buffer_bytes), pages) == want


def test_a_negative_page_count_is_refused():
    with pytest.raises(InvalidRequestError):
        spaced_budget(geom("qwen3-next-80b-a3b", 16 * GIB), -1)


def test_no_budget_without_state_or_bytes():
    g = CacheGeometry(P, (WindowPolicy(0, P, 128), FullPolicy(1, P)))
    assert spaced_budget(g) is None
    g = CacheGeometry(P, (StatePolicy(0, P), FullPolicy(1, P)))
    assert spaced_budget(g, 100) is None  # bytes unknown
    # ... so spaced keeps every block boundary there, as blocks.
    assert resume_points(g, 100, 32, SPACED) == (32, 64, 96, 100)


def test_auto_is_spaced_on_a_state_chain_and_blocks_otherwise():
    assert ResumePolicy.AUTO.resolve(geom("qwen3-next-80b-a3b", 16 * GIB)) is SPACED
    assert ResumePolicy.AUTO.resolve(geom("gpt-oss-120b", 16 * GIB)) is ResumePolicy.BLOCKS


@pytest.mark.parametrize(("budget_bytes", "whole", "want"), [
    # 500 pages, L = 15 boundaries; C = 6: K = ceil(15 / 5) = 3: blocks 15, 12, 9, 6, 3.
    (6, 500, (96, 192, 288, 384, 480, 500)),
    # C = 16 >= L + 1: every boundary (blocks).
    (16, 500, (*range(32, 481, 32), 500)),
    # C = 2: K = ceil(15 / 1) = 15: only block 15 (= ends).
    (2, 500, (480, 500)),
    # 480 pages (the last page is a boundary), C = 3: K = ceil(15 / 2) = 8: blocks 15, 7.
    (3, 480, (224, 480)),
    # fewer than one interval: only the last page.
    (6, 20, (20,)),
])
def test_spaced_points_by_hand(budget_bytes, whole, want):
    # A geometry whose budget is exactly ``budget_bytes`` checkpoints: B = C * 64 * S.
    g = CacheGeometry(P, (StatePolicy(0, P), FullPolicy(1, P)), slot_bytes=1000,
                      buffer_bytes=budget_bytes * 64 * 1000)
    assert spaced_budget(g) == budget_bytes
    assert resume_points(g, whole, 32, SPACED) == want


def shared_prompts() -> list[list[int]]:
    shared = tokens(1, 6000)
    return [shared + tokens(10 + i, 2000) for i in range(8)]


@pytest.mark.parametrize("buffer_bytes", [16 * GIB, 40 * GIB])
def test_second_request_hits_the_spaced_checkpoint_in_the_shared_prefix(buffer_bytes):
    # qwen3-next, 500 whole pages: C = min(6 or 16, 4) = 4 (the prompt's own pages bound
    # it), L = 15, K = ceil(15 / 3) = 5: points 160, 320, 480, 500. Request 1 shares 375
    # pages (6,000 tokens) with request 0's path; the deepest of request 0's checkpoints at
    # or below 375 is 320 pages: hit 320 x 16 = 5,120 tokens. Its junction: 375 - 320 = 55
    # >= 32 pages: saved at 375, its chunk cut there (6,000 - 5,120 = 880, then 2,000).
    # Requests 2..7 resume at 375: 6,000 tokens.
    hits, chunks = serve_one_by_one(
        scheduler("qwen3-next-80b-a3b", policy=ResumePolicy.AUTO, buffer_bytes=buffer_bytes),
        shared_prompts())
    assert hits == [0, 5120] + [6000] * 6
    assert chunks[1] == [880, 2000]


def test_second_request_misses_with_the_old_placement():
    # ends: request 0 keeps 480 and 500 only, both in its own part: request 1 hits 0 (and
    # saves the junction), requests 2..7 hit 6,000.
    hits, _ = serve_one_by_one(
        scheduler("qwen3-next-80b-a3b", policy=ResumePolicy.ENDS, buffer_bytes=16 * GIB),
        shared_prompts())
    assert hits == [0, 0] + [6000] * 6


def test_a_budget_that_holds_every_block_keeps_blocks():
    # A geometry whose budget holds every boundary (bytes unknown: no bound), as blocks:
    # request 1 hits the last boundary below 375 pages, 352 (11 x 32) = 5,632 tokens. Its
    # junction adds 375 - 352 = 23 pages: fewer than 32, but at least ceil(375 / 20) = 19
    # (over 5 % of the prefix): saved at 375; requests 2..7 hit 6,000.
    hits, _ = serve_one_by_one(
        scheduler("qwen3-next-80b-a3b", policy=ResumePolicy.BLOCKS, buffer_bytes=40 * GIB),
        shared_prompts())
    assert hits == [0, 5632] + [6000] * 6


def test_jet_nemotron_keeps_the_ends_of_a_short_prompt():
    # jet-nemotron at 16 GiB: C = max(2, min(18, 2)) = 2 for 500 pages (its state slot is
    # 14.7 MB, its prompt's full pages 16.4 MB): ends, so request 1 misses and saves the
    # junction; requests 2..7 hit 6,000.
    hits, _ = serve_one_by_one(
        scheduler("jet-nemotron-2b", policy=ResumePolicy.AUTO, buffer_bytes=16 * GIB),
        shared_prompts())
    assert hits == [0, 0] + [6000] * 6


def long_context_prompts() -> list[list[int]]:
    context = tokens(4, 258_000)
    return [context + tokens(40 + i, 600) for i in range(3)]


def test_long_context_keeps_spaced_checkpoints_where_blocks_keeps_none():
    # 258,600 tokens: 16,162 whole pages, L = 505 boundaries (16,160 pages); the context
    # is 16,125 pages. qwen3-next at 16 GiB, C = min(6, 160) = 6: K = ceil(505 / 5) = 101,
    # blocks 505,
    # 404, 303, 202, 101; the deepest in the context: 404 x 32 = 12,928 pages = 206,848
    # tokens, request 1's hit. Its junction at 16,125 (gain 3,197 pages) lets request 2
    # hit the whole context, 258,000 tokens.
    hits, _ = serve_one_by_one(
        scheduler("qwen3-next-80b-a3b", policy=ResumePolicy.AUTO, buffer_bytes=16 * GIB),
        long_context_prompts())
    assert hits == [0, 206_848, 258_000]


def test_long_context_with_blocks_keeps_nothing():
    # The old all-or-nothing: 506 points x 39.5 MB (about 20 GB) cannot fit 16 GiB, so
    # the scheduler saves no point for request 0, nor (506 + a junction) for request 1:
    # nothing is ever resumable.
    hits, _ = serve_one_by_one(
        scheduler("qwen3-next-80b-a3b", policy=ResumePolicy.BLOCKS, buffer_bytes=16 * GIB),
        long_context_prompts())
    assert hits == [0, 0, 0]
