"""A seeded stream of speculative steps on the request layer (issue 24 item 6): requests
prefill, take speculative extends of ``1 + k`` tokens and verify a random ``a`` of them,
finish; some extends do not fit (refused: nothing changes). After every rollback the audits
check that no page or slot leaked (:meth:`KVManager.audit`) and that no rejected draft's
page, window slack or checkpoint slot is kept (:meth:`KVManager.audit_settled`). Planted
siblings: a rollback that forgets one page, one that loses one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.alloc.chain import Chain
from kvchain.bands.geometry import StateRollback
from kvchain.errors import AuditError, CapacityError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager
from kvchain.requests.table import RequestTable


def manager(k: int, buffer: int,
            rollback: StateRollback = StateRollback.CHECKPOINTS) -> KVManager:
    # P = 4; windows of 6 (window) and 8 (local chunk) tokens, a full class, 16 B slots
    layout = plan_layout([declared_class(LC.FULL, 1), declared_class(LC.WINDOW, 1, 6),
                          declared_class(LC.LOCAL, 1, 8), declared_class(LC.STATE, 16)],
                         buffer, 4)
    return KVManager(Chain(layout, debug_audit=True), spec_tokens=k, rollback=rollback)


def run_stream(seed: int, k: int, p: float, steps: int = 60, buffer: int = 2_048,
               rollback: StateRollback = StateRollback.CHECKPOINTS) -> int:
    """Run the stream; returns how many rollbacks were audited."""
    rng = np.random.default_rng(seed)
    kv = manager(k, buffer, rollback)
    decoding: list[int] = []
    audited = next_rid = 0
    for _ in range(steps):
        if rng.random() < 0.3 or not decoding:  # a new request's whole prompt
            rid, n = next_rid, int(rng.integers(1, 20))
            next_rid += 1
            try:
                kv.allocate([(rid, n)])
            except CapacityError:
                continue
            kv.commit(rid, n)
            decoding.append(rid)
            continue
        if rng.random() < 0.15:  # one finishes
            kv.free(decoding.pop(int(rng.integers(len(decoding)))))
            kv.audit()
            continue
        batch = [rid for rid in decoding if rng.random() < 0.8] or decoding[:1]
        before = [(kv.held(rid), kv.tokens(rid)) for rid in batch]
        try:
            kv.allocate([(rid, 1 + k) for rid in batch], kv.decode_demands(batch, k))
        except CapacityError:  # refused: nothing changed
            assert [(kv.held(rid), kv.tokens(rid)) for rid in batch] == before
            kv.free(decoding.pop())  # make room, as a retraction would
            kv.audit()
            continue
        accepted = (np.cumprod(rng.random((len(batch), k)) < p, axis=1).sum(axis=1)
                    if k else np.zeros(len(batch), dtype=np.int64))
        kv.verify(batch, accepted, k)
        for rid, (_, tokens), a in zip(batch, before, accepted.tolist(), strict=True):
            assert kv.tokens(rid) == tokens + 1 + a
        kv.audit()
        kv.audit_settled(decoding)
        audited += 1
    for rid in decoding:
        kv.free(rid)
    kv.audit()
    assert all(kv.chain.bound_pages(b) == kv.chain.layout.bands[b].reserved_pages
               for b in range(kv.geom.num_bands))  # everything back: nothing leaked
    return audited


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), k=st.integers(0, 4), p=st.floats(0.0, 1.0),
       rollback=st.sampled_from(StateRollback))
def test_every_rollback_is_audited_clean(seed: int, k: int, p: float,
                                         rollback: StateRollback) -> None:
    run_stream(seed, k, p, rollback=rollback)


def test_the_stream_rolls_back_and_refuses() -> None:
    # the stream exercises what it claims: rollbacks audited, and some extends refused
    assert run_stream(1, 3, 0.5) >= 20
    refused = []
    orig = KVManager.allocate

    def counting(self: KVManager, *args: object, **kw: object) -> object:
        try:
            return orig(self, *args, **kw)  # type: ignore[arg-type]
        except CapacityError:
            refused.append(1)
            raise

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(KVManager, "allocate", counting)
        run_stream(1, 3, 0.5, steps=200, buffer=1_024)
    assert refused


def forgetful_truncate(self: RequestTable, band: int, slots: np.ndarray,
                       keep_end: np.ndarray) -> np.ndarray:
    """Planted defect: the rollback keeps one rejected page per band (the row keeps it)."""
    return _TRUNCATE(self, band, slots, keep_end + 1)


def losing_truncate(self: RequestTable, band: int, slots: np.ndarray,
                    keep_end: np.ndarray) -> np.ndarray:
    """Planted defect: the rollback takes the pages out of the rows but hands one back to
    nobody (it is never released: a leak)."""
    vids = _TRUNCATE(self, band, slots, keep_end)
    return vids[1:]


_TRUNCATE = RequestTable.truncate


@pytest.mark.parametrize("defect, match", [(forgetful_truncate, "rolled-back page kept"),
                                           (losing_truncate, "leaked")])
def test_a_defective_rollback_is_caught(monkeypatch: pytest.MonkeyPatch, defect: object,
                                        match: str) -> None:
    monkeypatch.setattr(RequestTable, "truncate", defect)
    with pytest.raises(AuditError, match=match):
        run_stream(1, 3, 0.3)
