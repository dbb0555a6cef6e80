"""Hit-rate bounds: a tiny trace computed by hand, the bundled Mooncake numbers, the CLI."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvchain.cli import _load_commands, app
from kvchain.errors import ConfigError
from kvchain.sim.prefix_bounds import hit_bound, keyed_prompts, walk_bound
from kvchain.sim.traces import TraceRequest, load_trace


def tiny() -> list[TraceRequest]:
    """Blocks of 4 tokens, pages of 2 (2 pages a block):

    r0 (8 tokens, blocks 1 2): 4 pages, all new.
    r1 (10, blocks 1 2 3): its first 4 pages are r0's -> 8 hit tokens; page 4 is new.
    r2 (6, blocks 1 9): pages 0-1 hit (block 1) -> 4 tokens; page 2 (block 9) is new.
    r3 (5, blocks 7 8): 2 whole pages, both new.
    """
    rows = [(8, (1, 2)), (10, (1, 2, 3)), (6, (1, 9)), (5, (7, 8))]
    return [TraceRequest(i, float(i), p, 1, ids) for i, (p, ids) in enumerate(rows)]


def test_infinite_cache_by_hand():
    b = hit_bound(tiny(), 2, block_tokens=4)
    assert (b.requests, b.prompt_tokens, b.hit_tokens) == (4, 29, 12)
    assert b.hit_rate == pytest.approx(12 / 29)


def test_lru_of_two_pages_by_hand():
    # Capacity 2 keeps each prompt's first two pages (the deepest are evicted first):
    # r1 hits pages 0-1 only (page 2 was evicted): 4 tokens; r2 hits pages 0-1: 4 tokens.
    b = hit_bound(tiny(), 2, capacity_pages=2, block_tokens=4)
    assert b.hit_tokens == 8 and b.capacity_pages == 2
    # Capacity 4 keeps r0's whole prompt: r1 hits 8 tokens, r2 4 tokens.
    assert hit_bound(tiny(), 2, capacity_pages=4, block_tokens=4).hit_tokens == 12


def test_requests_without_content_are_skipped_and_bad_sizes_refused():
    plain = [TraceRequest(0, 0.0, 8, 1)]
    assert hit_bound(plain, 2).requests == 0 and hit_bound(plain, 2).hit_rate == 0.0
    with pytest.raises(ConfigError):
        hit_bound(tiny(), 0)
    with pytest.raises(ConfigError):
        hit_bound(tiny(), 2, capacity_pages=0)


def test_bundled_mooncake_infinite_cache_limits():
    # Reference figures for the bundled Mooncake conversation trace at 16 tokens a page.
    assert round(100 * hit_bound(load_trace("mooncake", first=600).requests, 16).hit_rate,
                 2) == 17.16
    assert round(100 * hit_bound(load_trace("mooncake", first=2_000).requests, 16).hit_rate,
                 2) == 29.41


def test_cli_prints_both_bounds_as_json():
    _load_commands()
    result = CliRunner().invoke(app, ["prefix-bounds", "--requests", "600", "--json",
                                      "--capacity-pages", "29127"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["cache"] for r in rows] == ["infinite", "LRU 29,127 pages"]
    assert rows[0]["hit_tokens"] == 1_423_136 and rows[0]["prompt_tokens"] == 8_293_542
    assert 0.03 < rows[1]["hit_rate"] < rows[0]["hit_rate"]


@pytest.mark.parametrize("args", [["--requests", "0"], ["--capacity-bytes", "10"],
                                  ["--capacity-pages", "0"], ["--trace", "azure-conv",
                                                              "--requests", "5"]])
def test_cli_bad_input_exits_2(args):
    _load_commands()
    result = CliRunner().invoke(app, ["prefix-bounds", *args])
    assert result.exit_code == 2, result.output


def test_walk_bound_by_hand_reads_the_keys_it_is_given():
    # Pages of 16 tokens. p0 keys (1, 2); p1 (1, 2, 3) hits 2 pages; p2 (1, 2, 3) again.
    # Infinite: 0 + 32 + 48 = 80 hit tokens of 32 + 48 + 48 = 128.
    # LRU of 2: after p1 the order (least recent first) is 3, 2, 1, so 3 is evicted and
    # p2 hits 2 pages: 0 + 32 + 32 = 64.
    keyed = [(32, (1, 2)), (48, (1, 2, 3)), (48, (1, 2, 3))]
    inf = walk_bound(keyed, 16)
    assert (inf.requests, inf.prompt_tokens, inf.hit_tokens) == (3, 128, 80)
    assert walk_bound(keyed, 16, 2).hit_tokens == 64
    # hit_bound is the walk over keyed_prompts: the same totals as by hand above
    assert keyed_prompts(tiny(), 2, 4)[1][0] == 10
    assert walk_bound(keyed_prompts(tiny(), 2, 4), 2) == hit_bound(tiny(), 2, block_tokens=4)
    with pytest.raises(ConfigError):
        walk_bound(keyed, 16, 0)


def test_add_bounds_uses_the_runs_keys_and_computes_the_rest():
    from kvchain.sim.prefix import PrefixCacheStats as PrefixStats
    from kvchain.sim.traces import Trace
    from kvchain.testing.geometry import shape_geometry

    trace = Trace("tiny", tuple(tiny()), "by hand", "none", block_tokens=4)
    layout = shape_geometry("window|full", 2, pages=4096).layout()
    computed = PrefixStats().add_bounds(trace, layout)
    assert computed["prefix_infinite_bound_pct"] == round(100 * 12 / 29, 2)
    # the run's keys for r1 and r2 (every key), r0 and r3 from their block ids: the same
    given = {r.request_id: keyed_prompts([r], 2, 4)[0][1] for r in tiny()[1:3]}
    assert PrefixStats().add_bounds(trace, layout, None, given) == computed
    # a planted wrong key for r1 (its first page differs from r0's): r1 hits nothing, so
    # 4 of 29 tokens (r2's pages 0-1): the keys given are the ones counted
    planted = {1: (999, *given[1][1:])}
    assert PrefixStats().add_bounds(trace, layout, None, planted)[
        "prefix_infinite_bound_pct"] == round(100 * 4 / 29, 2)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 200),
                          st.lists(st.integers(0, 15), max_size=8).map(tuple)), max_size=12))
def test_infinite_walk_is_an_lru_that_never_fills(keyed):
    """The infinite cache is walked as a set (recency cannot matter when nothing is
    evicted): it hits what an LRU larger than every key ever seen hits, duplicates in a
    prompt included."""
    distinct = len({k for _, keys in keyed for k in keys})
    infinite = walk_bound(keyed, 16)
    lru = walk_bound(keyed, 16, distinct + 1)
    assert (infinite.requests, infinite.prompt_tokens, infinite.hit_tokens) == (
        lru.requests, lru.prompt_tokens, lru.hit_tokens)
    assert infinite.capacity_pages is None
