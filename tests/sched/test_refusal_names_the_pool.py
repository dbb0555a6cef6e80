"""A request that can never fit under fixed pools says which pool binds: the message read
"needs 196,509,696 B of pages at its peak, which can never fit on the empty chain
(299,967,232 B free)", a contradiction on its face (the bytes fit; one pool does not)."""

from __future__ import annotations

from kvchain.alloc.snapshot import Demand
from kvchain.baselines import ManagerKind, build_manager
from kvchain.catalog.loader import load_model
from kvchain.sched.scheduler import _band_cap_refusal


def test_the_binding_fixed_pool_is_named():
    setup = build_manager(ManagerKind.FIXED_POOLS, load_model("jet-nemotron-2b").classes,
                          300_000_000, 16)
    empty = setup.allocator.snapshot()
    labels = [b.label for b in empty.bands]
    full = labels.index("full")
    cap = empty.bands[full].cap
    # One full page more than the full pool holds, nothing else: its bytes fit the free
    # bytes of the whole buffer, the pool does not.
    need = Demand(tuple(cap + 1 if i == full else 0 for i in range(len(labels))))
    assert (cap + 1) * empty.bands[full].page_bytes <= empty.free_bytes
    assert _band_cap_refusal(empty, need) == (
        f"its {cap + 1:,} full pages pass the {cap:,} that band can ever hold (its pool or "
        f"index space)")
    # Within the pool: no band binds.
    assert _band_cap_refusal(empty, Demand(tuple(
        cap if i == full else 0 for i in range(len(labels))))) is None
