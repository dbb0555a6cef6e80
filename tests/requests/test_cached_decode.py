"""Decode with the prefix cache on takes the batched path (one table, one commit per batch):
no per-request commit, the cache's shared window pages unpinned rather than released, and
the same pages, pins and chain as committing request by request.

The tiny model (as tests/cache/test_insert_at_prefill_end.py): state | window | full,
``P = 16`` tokens, ``W = 32`` tokens, resume points every 64 tokens (4 pages).
"""

from __future__ import annotations

import random

import pytest

from kvchain.alloc.chain import Chain
from kvchain.cache.keys import page_keys_from_tokens
from kvchain.cache.radix import CacheGeometry, PrefixCache
from kvchain.errors import AuditError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.manager import KVManager

P = 16
STATE, WINDOW, FULL = 0, 1, 2


def manager() -> KVManager:
    layout = plan_layout([declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 32),
                          declared_class(LC.FULL, 1_000)], 30_000_000, P)
    return KVManager(Chain(layout, debug_audit=True),
                     PrefixCache(CacheGeometry.of(layout), interval_tokens=64))


def prefilled(prompts: list[list[int]]) -> KVManager:
    """Every prompt attached (the later ones hit the earlier ones' inserted pages) and
    prefilled in one chunk each: its prompt is in the cache, it decodes next."""
    kv = manager()
    for rid, tokens in enumerate(prompts):
        kv.attach(rid, page_keys_from_tokens(tokens, P), len(tokens))
        kv.allocate([(rid, len(tokens) - kv.tokens(rid))])
        kv.commit(rid, len(tokens) - kv.tokens(rid))
    kv.audit()
    return kv


PROMPTS = [list(range(1000, 1150)), list(range(1000, 1100)) + list(range(5000, 5070)),
           list(range(1000, 1150)), list(range(7000, 7033))]


def test_a_cached_decode_batch_commits_without_per_request_commits(monkeypatch) -> None:
    kv = prefilled(PROMPTS)
    calls = [0]
    real = KVManager.commit

    def counted(self, rid, tokens):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return real(self, rid, tokens)

    monkeypatch.setattr(KVManager, "commit", counted)
    rids = list(range(len(PROMPTS)))
    for _ in range(40):
        kv.allocate([(rid, 1) for rid in rids], kv.decode_demands(rids))
        kv.commit_decodes(rids)
        kv.audit()
    # Before the request table, a manager with a prefix cache committed each decode of the
    # batch one by one: 40 steps x 4 requests = 160 calls. Now none.
    assert calls[0] == 0


def test_the_batched_cached_decode_equals_committing_one_by_one() -> None:
    batched, one = prefilled(PROMPTS), prefilled(PROMPTS)
    rng = random.Random(5)
    rids = list(range(len(PROMPTS)))
    released = [0, 0]
    for _ in range(60):
        rng.shuffle(rids)
        demands = batched.decode_demands(rids)
        assert list(demands) == [one.demand(rid, 1) for rid in rids]
        batched.allocate([(rid, 1) for rid in rids], demands)
        one.allocate([(rid, 1) for rid in rids])
        released[0] += batched.commit_decodes(rids)
        released[1] += sum(one.commit(rid, 1) for rid in rids)
        assert [batched.held(r) for r in rids] == [one.held(r) for r in rids]
        assert batched.chain.snapshot() == one.chain.snapshot()
        assert batched.cache is not None and one.cache is not None
        assert batched.cache.pinned() == one.cache.pinned()
        assert batched.cache.eviction_order() == one.cache.eviction_order()
        batched.audit()
    # The 150-token prompts hold 9 shared pages; by 210 tokens the window [179, 210) has
    # left pages 0..10 behind: the batched path moved past the cache's pages too.
    assert released[0] == released[1] > 0
    for rid in rids:
        batched.free(rid)
        one.free(rid)
    batched.audit()
    assert batched.cache is not None and batched.cache.pinned() == ({}, {})


def test_a_batched_commit_that_forgets_to_unpin_is_caught(monkeypatch) -> None:
    # Sibling of the equality above: the batched path's unpin of the cache's window pages
    # left out; the pins then outlive the window and the audit (or the cache's own check on
    # free) reports it.
    kv = prefilled(PROMPTS)
    monkeypatch.setattr(CacheGlue, "unpin_pages", lambda *args: None)
    rids = list(range(len(PROMPTS)))
    with pytest.raises(AuditError):
        for _ in range(60):
            kv.allocate([(rid, 1) for rid in rids], kv.decode_demands(rids))
            kv.commit_decodes(rids)
            kv.audit()
        for rid in rids:
            kv.free(rid)
        kv.audit()
