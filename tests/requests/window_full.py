"""The small two-band manager several request-layer tests build by hand: a 40-token sliding
window and a full band, 1,024 B per page each, 4-token pages, in a 40 MB buffer."""

from __future__ import annotations

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests.manager import KVManager

WINDOW_FULL = [declared_class(LC.WINDOW, 1_024, 40), declared_class(LC.FULL, 1_024)]


def manager(**kwargs: object) -> KVManager:
    """A fresh manager on the window + full chain (``kwargs`` go to :class:`KVManager`)."""
    return KVManager(Chain(plan_layout(WINDOW_FULL, 40_000_000, 4)), **kwargs)  # type: ignore[arg-type]


def prefilled(prompts: list[int], kv: KVManager | None = None) -> KVManager:
    """``kv`` (default a fresh :func:`manager`) with request ``i`` prefilled to ``prompts[i]``
    tokens: allocated in one batch, then each committed."""
    kv = manager() if kv is None else kv
    batch = list(enumerate(prompts))
    kv.allocate(batch)
    for rid, n in batch:
        kv.commit(rid, n)
    return kv


def state(kv: KVManager, rids: range | tuple[int, ...]) -> tuple[object, ...]:
    """What a refusal must leave unchanged: the chain's epoch and take count, the number of
    requests, and each of ``rids``' tokens and held pages."""
    return (kv.chain.epoch, kv.chain.stats.takes, kv.num_requests,
            tuple((rid, kv.tokens(rid), kv.held(rid)) for rid in rids))
