"""The prefix cache's pure queries (``KVManager.points_for``, ``KVManager.cached_tokens``),
``KVManager.suspend``'s host and the ``KVManager`` constructor refuse bad input with a
typed error (:mod:`kvchain.errors`) and change nothing; the queries take keys and a prompt
length by the one rule ``attach`` takes them
(:func:`kvchain.requests.prompt_keys.check_page_keys`), so a query never answers for a
prompt ``attach`` refuses. Every refusal has a sibling where the good input of the same
call works.

The chain: window (``W = 8`` tokens) | full, 32 B per token per class, ``P = 4``: 128 B
pages in 64 KiB. The cache resumes every ``interval_tokens = 8`` tokens (2 pages), so a
prompt of ``n = 4`` whole pages keeps the points 2 and 4 (``BLOCKS``: no state band), plus
its resend point ``min(4, (L - 1) // 4)`` = 3 when ``L = 16`` (block-aligned), none extra
when ``L = 17``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from kvchain.alloc.chain import Chain
from kvchain.alloc.snapshot import Demand
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import BufferArgumentError, ConfigError, InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.attach import check_page_keys as attach_rule
from kvchain.requests.manager import KVManager
from kvchain.requests.prompt_keys import check_page_keys
from kvchain.requests.suspend import host_side_for

P = 4
K = [11, 12, 13, 14]  # 4 whole pages: a prompt of 16..19 tokens


def layout():
    return plan_layout([declared_class(LC.WINDOW, 32, 8), declared_class(LC.FULL, 32)],
                       64 * 1024, P)


def manager(cached: bool = False) -> KVManager:
    lay = layout()
    cache = PrefixCache(CacheGeometry.of(lay), interval_tokens=8) if cached else None
    return KVManager(Chain(lay), cache)


def warm() -> KVManager:
    """A cached manager holding request 0's prompt ``K`` (16 tokens) inserted whole: its 4
    pages and the window tails of its points 2, 3 and 4 (request 0 ended)."""
    kv = manager(cached=True)
    kv.attach(0, K, 16)
    kv.allocate([(0, 16)])
    kv.commit(0, 16)
    kv.free(0)
    return kv


def state(kv: KVManager) -> tuple:
    rows = {rid: (kv.tokens(rid), kv.held(rid)) for rid in range(4) if rid in kv}
    return (kv.chain.snapshot(), kv.chain.epoch, kv.num_requests, rows,
            kv.cache.held_pages() if kv.cache is not None else None)


# Bad (keys, prompt_tokens) pairs: each a factory (a generator is used up once).
BAD: dict[str, Callable[[], tuple[object, object]]] = {
    "15 tokens are 3 whole pages": lambda: (K, 15),
    "100 tokens are 25 whole pages": lambda: (K, 100),
    "2**70 tokens": lambda: (K, 2**70),
    "nan tokens": lambda: (K, math.nan),
    "-1 tokens": lambda: (K, -1),
    "0 tokens": lambda: ([], 0),
    "True tokens": lambda: (K, True),
    "16.0 tokens": lambda: (K, 16.0),
    "None tokens": lambda: (K, None),
    "no key for a 5-token prompt": lambda: ([], 5),
    "a float key": lambda: ([11.0, 12, 13, 14], 16),
    "a bool key": lambda: ([True, 12, 13, 14], 16),
    "a None key": lambda: ([None] * 4, 16),
    "a numpy key": lambda: ([np.int64(11), 12, 13, 14], 16),
    "numpy array keys": lambda: (np.array(K), 16),
    "generator keys": lambda: ((k for k in K), 16),
    "set keys": lambda: (set(K), 16),
    "dict keys": lambda: (dict.fromkeys(K, 1), 16),
    "an int as keys": lambda: (11, 16),
    "str keys": lambda: ("abcd", 16),
}


def test_the_rule_has_one_copy_shared_with_attach() -> None:
    assert attach_rule is check_page_keys
    assert check_page_keys(None, K, 16, P, "q") == (11, 12, 13, 14)
    with pytest.raises(InvalidRequestError, match=r"^q: 4 page keys for a prompt of 15"):
        check_page_keys(None, K, 15, P, "q")
    with pytest.raises(InvalidRequestError, match=r"^request 7: 4 page keys"):
        check_page_keys(7, K, 15, P)


# --- cached_tokens ---------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_cached_tokens_refuses_what_attach_refuses(case: str) -> None:
    kv = warm()
    before = state(kv)
    with pytest.raises(InvalidRequestError, match=r"^cached_tokens: "):
        kv.cached_tokens(*BAD[case]())
    assert state(kv) == before
    with pytest.raises(InvalidRequestError):  # attach refuses the same prompt
        kv.attach(1, *BAD[case]())
    assert state(kv) == before and 1 not in kv


def test_cached_tokens_refuses_none_keys() -> None:
    kv = warm()
    before = state(kv)
    with pytest.raises(InvalidRequestError, match=r"sequence of ints, got NoneType"):
        kv.cached_tokens(None, 16)  # type: ignore[arg-type]
    assert state(kv) == before


def test_cached_tokens_of_good_prompts() -> None:
    kv = warm()
    before = state(kv)
    # L = 16: a hit leaves one token to compute, at most (16 - 1) // 4 = 3 pages, and the
    # resend point 3 kept its tail: 3 x 4 = 12 tokens. L = 17: all 4 pages, 16 tokens.
    assert kv.cached_tokens(K, 16) == 12
    assert kv.cached_tokens(tuple(K), 17) == 16
    # Keys sharing 2 pages with K: the point 2 resumes, 8 tokens; none shared: 0.
    assert kv.cached_tokens([11, 12, 99, 98], 17) == 8
    assert kv.cached_tokens([1, 2, 3, 4], 16) == 0
    assert kv.cached_tokens([], 3) == 0  # under one page: no key, no hit
    assert state(kv) == before  # a pure match
    # ... and attach agrees with the query: the hit of K at 17 tokens is 16 tokens.
    assert kv.attach(1, K, 17) == 16 and kv.tokens(1) == 16


def test_cached_tokens_without_a_cache_checks_too() -> None:
    kv = manager()
    with pytest.raises(InvalidRequestError, match=r"^cached_tokens: 4 page keys"):
        kv.cached_tokens(K, 15)
    assert kv.cached_tokens(K, 16) == 0


# --- points_for ------------------------------------------------------------------------


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_points_for_refuses_what_attach_refuses(case: str) -> None:
    kv = warm()
    before = state(kv)
    with pytest.raises(InvalidRequestError, match=r"^points_for: "):
        kv.points_for(*BAD[case]())  # type: ignore[arg-type]
    assert state(kv) == before


def test_points_for_good_prompts() -> None:
    kv = warm()
    before = state(kv)
    assert kv.points_for(K, 16) == (2, 3, 4)  # the interval points 2, 4 and resend 3
    assert kv.points_for(tuple(K), 17) == (2, 4)  # not block-aligned: no resend point
    assert kv.points_for(K, 19) == (2, 4)
    assert kv.points_for(None, 16) == ()  # no keys: no point (the scheduler's call)
    assert kv.points_for([], 3) == ()
    assert state(kv) == before


@pytest.mark.parametrize("name", ["after", "junction"])
@pytest.mark.parametrize("bad", [-1, 5, 2**70, True, False, 1.5, 2.0, None, np.int64(1), "1"])
def test_points_for_refuses_after_or_junction_out_of_the_prompt(name: str, bad: object) -> None:
    kv = warm()
    before = state(kv)
    with pytest.raises(InvalidRequestError, match=rf"^points_for: {name} must be an int "
                                                  r"in \[0, 4\]"):
        kv.points_for(K, 16, **{name: bad})  # type: ignore[arg-type]
    assert state(kv) == before


def test_points_for_good_after_and_junction() -> None:
    kv = warm()
    assert kv.points_for(K, 16, after=0) == (2, 3, 4)
    assert kv.points_for(K, 16, after=2) == (3, 4)  # points past a 2-page hit
    assert kv.points_for(K, 16, after=4) == ()  # the whole prompt held: none
    assert kv.points_for(K, 16, junction=1) == (1, 2, 3, 4)  # a junction added, sorted
    assert kv.points_for(K, 17, junction=3) == (2, 3, 4)
    assert kv.points_for(K, 16, junction=4) == (2, 3, 4)  # already a point: once
    assert kv.points_for(K, 17, 3, 1) == (4,)  # the junction at or below after: dropped


def test_points_for_without_keys_still_checks_its_arguments() -> None:
    kv = warm()
    with pytest.raises(InvalidRequestError, match=r"^points_for: prompt_tokens must be"):
        kv.points_for(None, 16.0)  # type: ignore[arg-type]
    # Without keys n is still the prompt's whole pages, 16 // 4 = 4.
    with pytest.raises(InvalidRequestError, match=r"after must be an int in \[0, 4\]"):
        kv.points_for(None, 16, after=5)
    assert kv.points_for(None, 16, after=4) == ()


def test_points_for_without_a_cache_checks_too() -> None:
    kv = manager()
    with pytest.raises(InvalidRequestError, match=r"^points_for: 4 page keys"):
        kv.points_for(K, 15)
    with pytest.raises(InvalidRequestError, match=r"^points_for: junction"):
        kv.points_for(K, 16, junction=1.5)  # type: ignore[arg-type]
    assert kv.points_for(K, 16) == ()
    assert kv.points_for(None, 16) == ()


# --- suspend's host --------------------------------------------------------------------


@pytest.mark.parametrize("host", [None, "host", {"window": 8, "full": 8}])
def test_suspend_refuses_a_host_that_is_not_a_host_side(host: object) -> None:
    kv = manager()
    kv.allocate([(0, 5)])
    kv.commit(0, 5)
    before = state(kv)
    with pytest.raises(BufferArgumentError, match=r"suspend needs a HostSide"):
        kv.suspend(0, host)  # type: ignore[arg-type]
    assert state(kv) == before and 0 in kv and not kv.suspensions.is_suspended(0)


def test_suspend_to_a_host_side_works() -> None:
    kv = manager()
    kv.allocate([(0, 5)])
    kv.commit(0, 5)
    host = host_side_for(kv.chain.layout, 100_000, 8)
    # 5 tokens: ceil(5 / 4) = 2 window pages (the next token's window [-2, 5] reaches
    # page 0) and 2 full pages.
    sus = kv.suspend(0, host)
    assert sus.demand == Demand((2, 2)) and sus.tokens == 5
    assert 0 not in kv and kv.suspensions.is_suspended(0)


# --- the constructor -------------------------------------------------------------------


@pytest.mark.parametrize("chain", [None, object(), "chain", layout()])
def test_manager_refuses_a_chain_that_is_not_an_allocator(chain: object) -> None:
    with pytest.raises(ConfigError, match=r"KVManager needs an allocator"):
        KVManager(chain)  # type: ignore[arg-type]


def test_manager_over_a_chain_works() -> None:
    kv = KVManager(Chain(layout()))
    kv.allocate([(0, 5)])
    assert kv.tokens(0) == 0 and kv.held(0).spans == ((0, 2), (0, 2))


@pytest.mark.parametrize("flag", ["no", "", 1, 0, None, np.bool_(True), 1.0])
@pytest.mark.parametrize("cached", [False, True])
def test_manager_refuses_a_keep_window_tail_that_is_not_a_bool(flag: object,
                                                               cached: bool) -> None:
    lay = layout()
    chain = Chain(lay)
    cache = PrefixCache(CacheGeometry.of(lay), interval_tokens=8) if cached else None
    with pytest.raises(ConfigError, match=r"keep_window_tail must be a bool"):
        KVManager(chain, cache, keep_window_tail=flag)  # type: ignore[arg-type]
    assert chain.evictor is None  # the cache was not hooked in


@pytest.mark.parametrize("keep", [True, False])
def test_manager_with_a_bool_keep_window_tail_works(keep: bool) -> None:
    kv = KVManager(Chain(layout()), keep_window_tail=keep)
    kv.allocate([(0, 12)])
    kv.commit(0, 12)
    # 12 tokens: 3 pages per band; the next token's window [5, 12] starts at page 1, so
    # the release at the commit drops window page 0 unless the tail is kept.
    assert kv.held(0).spans == (((0, 3) if keep else (1, 3)), (0, 3))


def test_keep_window_tail_with_a_cache_is_still_refused() -> None:
    lay = layout()
    chain = Chain(lay)
    with pytest.raises(ConfigError, match=r"cannot run a prefix cache"):
        KVManager(chain, PrefixCache(CacheGeometry.of(lay), interval_tokens=8),
                  keep_window_tail=True)
    kv = KVManager(chain, PrefixCache(CacheGeometry.of(lay), interval_tokens=8))
    assert kv.cache is not None and chain.evictor is kv.cache
