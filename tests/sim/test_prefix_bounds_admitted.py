"""The hit-rate bounds a run prints are over the requests the run admitted.

The run's hit rate counts the prompts of admitted requests only; its bounds used to count
every request of the trace, rejected ones too, so a run with rejections printed a hit rate
above its own "infinite-cache" bound (35 Mooncake requests in 100 MB: 9.38 % against
3.62 %)."""

from __future__ import annotations

from kvchain.cache.radix import ResumePolicy
from kvchain.catalog.loader import load_model
from kvchain.gpu import get_gpu
from kvchain.sim.engine import SimConfig, simulate
from kvchain.sim.traces import Trace, TraceRequest

CONTEXT = 131_072  # gpt-oss-120b's context (tokens)


def _trace() -> Trace:
    """Request 0: 1,024 tokens = Mooncake blocks (1, 2); request 1: 274 blocks (1, 2, 3,
    ...) = 140,288 tokens, past the context: rejected; request 2, after request 0 ended:
    blocks (1, 2) again."""
    return Trace("rejected-between", (
        TraceRequest(0, 0.0, 1_024, 2, prefix_block_ids=(1, 2)),
        TraceRequest(1, 50.0, 274 * 512, 2, prefix_block_ids=tuple(range(1, 275))),
        TraceRequest(2, 100.0, 1_024, 2, prefix_block_ids=(1, 2)),
    ), source="test", license="test")


def test_bounds_count_only_admitted_requests():
    result = simulate(SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"), _trace(),
                                buffer_bytes=4_000_000_000,
                                cache_points=ResumePolicy.BLOCKS))
    s = result.summary
    assert CONTEXT < 274 * 512 and s.requests_rejected == 1 and s.requests_finished == 2
    # Admitted: requests 0 and 2, 2,048 prompt tokens. The infinite cache: request 2 finds
    # all 64 of its 16-token pages = 1,024 tokens -> 50 %. Counting the rejected request
    # (the old bound): request 1 finds 64 pages, request 2 64: 2,048 of 1,024 + 140,288 +
    # 1,024 = 142,336 tokens -> 1.44 %. The run: request 2 resumes at request 0's resend
    # point, page 63 (the last whole page, 64 = 1,024 tokens, is the whole prompt: at
    # least one token is computed; a block-aligned prompt keeps 63 too,
    # kvchain.cache.radix.resend_point; round 9 resumed at the block boundary 512) ->
    # 1,008 of 2,048 = 49.22 %.
    assert result.prefix_cache is not None
    assert (result.prefix_cache.prompt_tokens, result.prefix_cache.hit_tokens) == (2_048, 1_008)
    assert s.extra["prefix_hit_rate_pct"] == 49.22
    assert s.extra["prefix_infinite_bound_pct"] == 50.0
    assert s.extra["prefix_lru_bound_pct"] == 50.0  # 4 GB of full pages hold both prompts


def test_a_prompt_without_content_keys_is_a_miss_of_the_bounds_too():
    # Requests 0 and 2 as above (1,024 tokens, blocks (1, 2)) and request 1: 1,024 tokens
    # without hash_ids, which the run counts (its prompt is admitted, it cannot hit) and
    # the bounds skipped: 1,024 / 2,048 = 50 % against the run's 1,008 / 3,072 (request
    # 2's hit at request 0's resend point 63, as above). Now both
    # count it: the infinite cache hits request 2's 1,024 tokens of 3,072 = 33.33 %.
    trace = Trace("unkeyed-between", (
        TraceRequest(0, 0.0, 1_024, 2, prefix_block_ids=(1, 2)),
        TraceRequest(1, 50.0, 1_024, 2),
        TraceRequest(2, 100.0, 1_024, 2, prefix_block_ids=(1, 2)),
    ), source="test", license="test")
    result = simulate(SimConfig(load_model("gpt-oss-120b"), get_gpu("h200"), trace,
                                buffer_bytes=4_000_000_000,
                                cache_points=ResumePolicy.BLOCKS))
    assert result.prefix_cache is not None
    assert (result.prefix_cache.prompt_tokens, result.prefix_cache.hit_tokens) == (3_072, 1_008)
    assert result.summary.extra["prefix_infinite_bound_pct"] == 33.33
