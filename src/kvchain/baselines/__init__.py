"""Baseline memory managers behind the chain's interface (docs/design.md §6).

Each baseline is a chain-like allocator (:class:`~kvchain.baselines.pools.PoolAllocator`)
that the unchanged :class:`~kvchain.requests.manager.KVManager` and
:class:`~kvchain.sched.scheduler.Scheduler` drive exactly like a
:class:`~kvchain.alloc.chain.Chain`; only the capacity rule differs, and it is encoded in
the snapshot the planner prices. :mod:`kvchain.baselines.managers` builds the managers
(kvchain, fixed pools, equal-page pool, exact-bytes ideal) for a model and buffer.
"""

from kvchain.baselines.managers import (
    ManagerKind,
    ManagerSetup,
    build_manager,
    equal_page_geometry,
    fixed_pool_shares,
)
from kvchain.baselines.pools import CapacityRule, NoMovePin, PoolAllocator

__all__ = [
    "CapacityRule",
    "ManagerKind",
    "ManagerSetup",
    "NoMovePin",
    "PoolAllocator",
    "build_manager",
    "equal_page_geometry",
    "fixed_pool_shares",
]
