"""The checkpoint copy of a prefix-cache hit as a chain action (``CopyPages``): priced in
the quote (``copy_bytes``), executed by the chain's one take path through the buffer's
copy, counted in the chain's stats, and refused typed with nothing changed.

Layout (tests/alloc/test_chain.py's ``three_band_layout``): state LOW END with 48 B slots
| window FLOAT (32 B pages) | full HIGH END (32 B pages), page size 1, no null pages.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.alloc import Chain, Demand
from kvchain.alloc.snapshot import CopyPages
from kvchain.buffer import NumpyBuffer
from kvchain.errors import InvalidDemandError

from .test_chain import assert_same_state, full_state, three_band_layout

STATE = 0


def chain_with_a_checkpoint() -> tuple[Chain, NumpyBuffer, int]:
    """One state slot taken and written with a pattern (the cached checkpoint)."""
    layout = three_band_layout()
    buf = NumpyBuffer(layout.buffer_bytes)
    chain = Chain(layout, buf)
    (src,) = chain.take(Demand((1, 0, 0))).pages[STATE]
    bl = layout.bands[STATE]
    phys = int(chain.translate(STATE, np.array([src], dtype=np.int64))[0])
    buf.write_page(bl, phys, (np.arange(48) * 7 % 251).astype(np.uint8))
    return chain, buf, int(src)


def test_copy_priced_taken_and_counted() -> None:
    chain, buf, src = chain_with_a_checkpoint()
    copy = CopyPages(STATE, (src,), (0,))
    demand = Demand((1, 1, 1))  # a new request: its state slot, one window, one full page
    quote = chain.price(demand, (copy,))
    # one state slot of 48 B is copied; nothing moves (the gaps hold the demand)
    assert quote.fits and quote.copy_bytes == 48
    assert quote.after == chain.price(demand).after  # a copy changes no count
    before = chain.stats
    grant = chain.take(demand, quote)
    (dst,) = grant.pages[STATE]
    bl = chain.layout.bands[STATE]
    read = [buf.read_page(bl, int(chain.translate(STATE, np.array([v]))[0])) for v in (src, dst)]
    assert np.array_equal(read[0], read[1])  # the request's slot holds the checkpoint
    assert chain.stats.copies == before.copies + 1
    assert chain.stats.copy_bytes == before.copy_bytes + 48
    assert chain.stats.pages_copied == before.pages_copied  # not a move
    assert chain.snapshot() == grant.quote.after  # price == outcome


@pytest.mark.parametrize("copy", [
    CopyPages(STATE, (0,), (1,)),  # destination past the 1 state page the take binds
    CopyPages(3, (0,), (0,)),  # no band 3 on a three-band chain
    CopyPages(STATE, (0, 0), (0,)),  # two sources, one destination
])
def test_bad_copy_refused_and_nothing_changes(copy: CopyPages) -> None:
    chain, buf, _ = chain_with_a_checkpoint()
    state = full_state(chain, buf)
    with pytest.raises(InvalidDemandError):
        chain.take(Demand((1, 1, 1)), None, (copy,))
    assert_same_state(state, full_state(chain, buf))
