"""PoolAllocator.translate keeps Chain.translate's contract: integer, bound ids only."""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import Demand
from kvchain.baselines import ManagerKind, build_manager
from kvchain.errors import UnknownPageError
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass

WIN = declared_class(LifetimeClass.WINDOW, 1_000, 32)
FULL = declared_class(LifetimeClass.FULL, 1_000)


def _two_full_pages(kind: ManagerKind) -> tuple[Allocator, np.ndarray]:
    # B = 1.8 MB, P = 16: both managers have room for 2 full pages (16,000 B each).
    alloc = build_manager(kind, [WIN, FULL], 1_800_000, 16).allocator
    grant = alloc.take(Demand((0, 2)))
    return alloc, np.asarray(grant.pages[1], dtype=np.int64)


@pytest.mark.parametrize("kind", [ManagerKind.FIXED_POOLS, ManagerKind.KVCHAIN])
def test_translate_refuses_float_ids(kind: ManagerKind) -> None:
    # Before: the pools cast 5.7 to 5 and returned a page the caller may never have held.
    alloc, ids = _two_full_pages(kind)
    with pytest.raises(UnknownPageError, match="integers"):
        alloc.translate(1, ids.astype(np.float64) + 0.7)


def test_pool_translate_refuses_unbound_ids() -> None:
    alloc, ids = _two_full_pages(ManagerKind.FIXED_POOLS)
    assert alloc.translate(1, ids).tolist() == ids.tolist()  # pool pages never move
    with pytest.raises(UnknownPageError, match="unbound"):
        alloc.translate(1, np.array([int(ids.max()) + 1]))
