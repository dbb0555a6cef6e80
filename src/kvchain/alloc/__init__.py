"""The chain allocator: snapshots and plans (pure), bands and the chain executor."""

from kvchain.alloc.allocator import Allocator, MoveHold
from kvchain.alloc.chain import Chain, ChainStats, GateState, Grant, MovePin
from kvchain.alloc.evictor import Evictor
from kvchain.alloc.snapshot import (
    Action,
    BandSnapshot,
    ChainSnapshot,
    Compact,
    Demand,
    Evict,
    EvictionOrder,
    Extend,
    PlanStep,
    Quote,
    RefusalReason,
    Relocate,
    Side,
    UseHoles,
    WaitFence,
)

__all__ = [
    "Action",
    "Allocator",
    "BandSnapshot",
    "Chain",
    "ChainSnapshot",
    "ChainStats",
    "Compact",
    "Demand",
    "Evict",
    "EvictionOrder",
    "Evictor",
    "Extend",
    "GateState",
    "Grant",
    "MoveHold",
    "MovePin",
    "PlanStep",
    "Quote",
    "RefusalReason",
    "Relocate",
    "Side",
    "UseHoles",
    "WaitFence",
]
