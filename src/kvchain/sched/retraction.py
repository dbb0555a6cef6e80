"""Where a retracted request's KV goes: dropped and recomputed, or copied to host and loaded
back (retraction by host copy, issue 23 item 5; the request layer's part is
:mod:`kvchain.requests.suspend`).

``recompute`` (the default, vLLM's and SGLang's default preemption): the victim frees
everything and prefills its prompt and the tokens it generated again. ``host``: the victim's
pages and state slots are copied to host slots (:meth:`KVManager.suspend
<kvchain.requests.manager.KVManager.suspend>`) and loaded back on resume, which admission
prices like any demand through the one prefill budget; if the host pools have no room the
victim is recomputed instead (counted: ``SchedulerCounters.host_retract_fallbacks``).
``auto``: host copy when the cost model says it is faster than recomputing - a
:class:`RetractionCost` compares the time of the copy out and the load back with the time of
the prefill it saves (the victim's computed tokens less those the prefix cache would serve
it again) - and no other running request reads the victim's prefix-cache pages (a host copy
would come back as a private second copy of them; :meth:`Scheduler._to_host
<kvchain.sched.scheduler.Scheduler._to_host>`).
"""

from __future__ import annotations

import enum
from typing import Protocol


class RetractTo(enum.StrEnum):
    """Where a retracted request's KV goes (module docstring)."""

    RECOMPUTE = "recompute"
    HOST = "host"
    AUTO = "auto"


class RetractionCost(Protocol):
    """What ``auto`` asks the cost model (the simulator passes its roofline:
    :func:`kvchain.sim.engine.retraction_cost`)."""

    def host_is_cheaper(self, computed_tokens: int, host_bytes: int) -> bool:
        """Whether copying ``host_bytes`` to host and back (two transfers over the host
        link) takes less time than prefilling the ``computed_tokens`` tokens the request
        would otherwise compute again."""
        ...
