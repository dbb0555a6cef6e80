"""kvchain: one shared KV-cache buffer for hybrid LLMs.

Every lifetime class of a hybrid model (full attention, sliding window, chunked local
attention, recurrent state) gets a *band* of one byte buffer; the bands form a *chain*
whose boundaries move as demand moves. Capacity decisions are pure functions of a small
snapshot of the chain (see ``docs/architecture.md``).
"""

__version__ = "0.1.0"
