"""A partial prefix-cache hit's gap is prefill compute (issue 22 item 3): the cost model
prices the first chunk of such a request as one chunk from the checkpoint ``C`` over the
gap and the chunk's own tokens (every layer runs over the gap; the full-attention layers
read the cached KV there), and the hit rate counts ``C`` only.

Trace (512-token content blocks, P = 16): request A, 16 blocks (8,192 tokens, 512 whole
pages); request B, long after A ends, shares A's first 11 blocks (5,632 tokens = 352
pages) and adds 5 of its own (8,192 tokens). qwen3-next-80b-a3b at 16 GiB: A's spaced
points: budget ``min(6, 512 x 393,216 // 39,518,208 = 5) = 5``, ``L = 16`` boundaries,
``K = ceil(16 / 4) = 4``: blocks 4, 8, 12, 16 = pages 128, 256, 384, 512. B's deepest
checkpoint at or below 352 is C = 256 pages (4,096 tokens)."""

from __future__ import annotations

from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sched.scheduler import SchedulerConfig
from kvchain.sim import cost
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest

A = tuple(range(16))
B = tuple(range(11)) + tuple(range(100, 105))
TRACE = Trace("partial", (TraceRequest(0, 0.0, 8192, 2, A), TraceRequest(1, 100.0, 8192, 2, B)),
              "hand-made", "n/a", block_tokens=512)


def chunks_priced(monkeypatch, partial: bool):  # type: ignore[no-untyped-def]
    """The ``(tokens, context)`` of every prefill chunk the cost model priced, and the
    run's summary."""
    seen: list[tuple[int, int]] = []
    add = cost.StepWorkBuilder.add_prefill

    def spy(self, tokens, context):  # type: ignore[no-untyped-def]
        seen.append((tokens, context))
        return add(self, tokens, context)

    monkeypatch.setattr(cost.StepWorkBuilder, "add_prefill", spy)
    result = simulate(SimConfig(load_model("qwen3-next-80b-a3b"), get_gpu("h200"), TRACE,
                                buffer_bytes=16 << 30,
                                scheduler=SchedulerConfig(partial_hits=partial)),
                      audit_every_step=True)
    return seen, result.summary


def test_the_gap_is_priced_as_prefill_from_the_checkpoint(monkeypatch):
    # Partial: B shares H = 352 pages, resumes its state at C = 256: gap 96 pages = 1,536
    # tokens, own tokens 8,192 - 5,632 = 2,560: one chunk of 1,536 + 2,560 = 4,096 tokens
    # after 4,096 of context. A: one chunk of 8,192 at 0. Hit tokens: C = 4,096 of 16,384
    # prompt tokens; partial tokens 1,536.
    seen, summary = chunks_priced(monkeypatch, partial=True)
    assert seen == [(8192, 0), (4096, 4096)]
    assert summary.extra["prefix_hit_tokens"] == 4096
    assert (summary.extra["partial_hits"], summary.extra["partial_tokens"]) == (1, 1536)
    assert summary.admitted_but_unallocatable == 0 and summary.leaked_pages == 0


def test_without_partial_hits_the_same_tokens_are_two_chunks(monkeypatch):
    # B hits C = 256 pages and saves its junction at 352: chunks 1,536 at 4,096 (cut at
    # the junction) and 2,560 at 5,632: the same tokens computed, in two steps.
    seen, summary = chunks_priced(monkeypatch, partial=False)
    assert seen == [(8192, 0), (1536, 4096), (2560, 5632)]
    assert summary.extra["prefix_hit_tokens"] == 4096
    assert "partial_tokens" not in summary.extra
