"""Requests on the chain: the KV manager, a facade over the request layer's parts.

Every request's pages live in one place, the :class:`~kvchain.requests.table.RequestTable`
(a row per request, a 2-D page-id array per band); one request and a decode batch read
and write the same arrays. The page formulas of each band kind (which pages a chunk needs,
which the window-tail release drops after a forward) are the band policies'
(:mod:`kvchain.bands.policies`); :func:`kvchain.requests.demand.request_demand` is the
one pure demand function. After the forward that computed tokens up to ``L``, window
pages wholly before the next token's window (the policy's ``first_page(L)``) are released
(window-tail release); the rows keep the band's null page in their place. The prefix
cache's part (hits, resume points, the prompt's insert) is
:class:`~kvchain.requests.cache_glue.CacheGlue`'s.

:class:`KVManager` builds the parts over the rows, the geometry, the chain and the glue,
and each of its methods is a one-line delegation to one of them: the step path
(:class:`~kvchain.requests.step.StepPath`: demands, the step plan, its take, the decode
commit), the commits, the hits, the suspensions, the verify, the reads and the audits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.snapshot import Demand, Quote
from kvchain.bands.geometry import RequestGeometry, StateRollback
from kvchain.cache.radix import PrefixCache
from kvchain.errors import ConfigError, ReservedPageError
from kvchain.requests.attach import Attach
from kvchain.requests.audit import Audit
from kvchain.requests.batch import DecodeBatch
from kvchain.requests.cache_glue import CacheGlue
from kvchain.requests.commits import Commits, check_tail_strategy
from kvchain.requests.demand import HeldPages
from kvchain.requests.plan import StepPlan
from kvchain.requests.reads import Reads
from kvchain.requests.rows import Rows
from kvchain.requests.speculative import Speculation
from kvchain.requests.step import StepPath
from kvchain.requests.suspend import HostSide, Suspended, Suspensions
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts, RequestView


class KVManager:
    """The engine's KV cache manager: requests' virtual pages per band on one chain.

    Every allocation is one ``chain.take`` of the summed demand of a batch (prefill chunks
    and decode tokens together), so what admission priced as one demand is realized as one
    plan. The manager never moves frontiers itself.

    Args:
        chain: the chain.
        cache: a prefix cache over the same chain (attached to it as its evictor), or
            ``None``. With a cache, requests that carry page keys are matched by
            :meth:`attach`, point at the cache's pages for their hit, and insert their
            prompt's pages as their prefill computes them, at the commit of every chunk
            that completes whole pages (:meth:`commit`).
        spec_tokens: drafts ``k`` of a speculative decode step (0: none). A request then
            claims ``k`` more state slots with its first chunk (the checkpoints a rollback
            picks from), and its demands count the window slack and ``k`` more tokens
            (:attr:`RequestGeometry.spec_tokens`). A speculative step is
            :meth:`decode_demands` with ``drafts = k``, :meth:`allocate` of
            ``(rid, 1 + k)``, then :meth:`verify` with the accepted drafts.
        rollback: how state bands roll back (:class:`StateRollback`: ``k`` checkpoint
            slots, or one plus a replay of the accepted tokens, which the engine runs).
        keep_window_tail: the window-tail release strategy: release out-of-window pages
            only when the decode check reclaims them (:meth:`reclaim_window_pages`) or
            the request ends, not at every commit (engines that keep window pages until
            they need the room; :class:`~kvchain.requests.commits.Commits`).

    The class is the facade, every method a one-line delegation: the step (demands, the
    step plan, its take, the decode commit, runs of decode steps) is :attr:`steps`', the
    commits and releases :attr:`commits`', the hits :attr:`attachments`', the read views
    :attr:`reads`', the verify :attr:`speculation`'s, the suspensions
    :attr:`suspensions`', the audits :attr:`audits`' (each built here over the rows, the
    geometry, the chain and the glue, never the manager).

    Raises:
        ConfigError: ``chain`` not an :class:`~kvchain.alloc.allocator.Allocator` (one
            of its members missing: ``None`` included), ``keep_window_tail`` not a bool,
            a prefix cache on an allocator without an evictor hook, or with
            ``keep_window_tail``; ``spec_tokens`` not an int >= 0.
    """

    def __init__(self, chain: Allocator, cache: PrefixCache | None = None,
                 spec_tokens: int = 0,
                 rollback: StateRollback = StateRollback.CHECKPOINTS,
                 keep_window_tail: bool = False) -> None:
        if not isinstance(chain, Allocator):  # the protocol's members, by name
            raise ConfigError(f"KVManager needs an allocator (a Chain or a baseline's "
                              f"PoolAllocator: layout, planner, price, take, release, ...), "
                              f"got {type(chain).__name__}")
        if type(keep_window_tail) is not bool:
            raise ConfigError(f"keep_window_tail must be a bool, got {keep_window_tail!r}")
        check_tail_strategy(cache is not None, keep_window_tail)  # before any change
        self.chain = chain
        self.geom = geom = RequestGeometry.of(chain.layout, spec_tokens, rollback)
        pads = []
        for band in range(geom.num_bands):
            try:
                pads.append(chain.null_page(band))
            except ReservedPageError:
                pads.append(-1)
        self._table = RequestTable(geom.policies, pads)
        rows = self._rows = Rows(self._table)  # the requests' facts by id, over the table
        self._requests: dict[int, CacheFacts] = rows.facts
        self._glue = glue = CacheGlue(chain, cache, geom, self._table)
        self.cache = cache
        # the collaborators get what they read (rows, geometry, chain, glue), and the
        # manager's own steps they call as callables, looked up at each call (so a
        # subclass's or a test's override of a step is the one they run)
        self.reads = Reads(rows, geom, chain)  # page and block tables, pages per band
        self.suspensions = Suspensions(  # requests suspended to host
            rows, self.reads, lambda rid: self.free(rid, insert=False),
            lambda rid, quote: self.allocate([], None, quote, resumes=(rid,)))
        self._suspended = self.suspensions.records  # the one record (rid ->), read here
        self.steps = StepPath(  # demands, the step plan, its take, the decode commit
            rows, geom, chain, glue, self._suspended, lambda rid, n: self.demand(rid, n),
            lambda rid, n: self.commit(rid, n),
            lambda resumes, ids: self._check_resumes(resumes, ids),
            lambda sus, vids: self._restore(sus, vids), keep_window_tail)
        self.commits = Commits(rows, geom, chain, glue, self.steps.uncovered,
                               keep_window_tail)  # commits, window-tail release, free
        self.attachments = Attach(rows, glue, self._suspended)  # prefix-cache hits by id
        self.speculation = Speculation(  # verify of speculative steps
            rows, geom, chain, glue, lambda rid, n: self.commit(rid, n),
            self.steps.release_fronts, batched=not keep_window_tail)
        self.audits = Audit(rows, geom, chain, glue)  # the page and rollback audits

    @property
    def glue(self) -> CacheGlue:
        """The prefix cache's part (:class:`CacheGlue`), whose counters the simulator
        reports: ``cow_state_copies``, ``cow_bytes``, ``checkpoints_saved``,
        ``junctions_saved``, ``prompts_inserted``, ``chunk_inserts``."""
        return self._glue

    # --- queries (:class:`Rows`, :class:`StepPath`) -----------------------------------------

    def __contains__(self, rid: int) -> bool:
        """:meth:`Rows.__contains__ <kvchain.requests.rows.Rows.__contains__>`: whether
        ``rid`` holds pages (InvalidDemandError: not an int request id)."""
        return rid in self._rows

    def _facts(self, rid: int) -> CacheFacts:
        """:meth:`Rows.of <kvchain.requests.rows.Rows.of>` (UnknownRequestError)."""
        return self._rows.of(rid)

    def pages(self, rid: int) -> RequestView:
        """A read-only view of what request ``rid`` holds.

        Raises:
            UnknownRequestError: it holds nothing.
        """
        return RequestView(self._table, self._rows.of(rid))

    def held(self, rid: int) -> HeldPages:
        """:meth:`Rows.held <kvchain.requests.rows.Rows.held>`: counts held by ``rid``
        (:data:`~kvchain.requests.demand.NOTHING_HELD` if it holds nothing)."""
        return self._rows.held(rid)

    def tokens(self, rid: int) -> int:
        """:meth:`Rows.tokens <kvchain.requests.rows.Rows.tokens>`: tokens of ``rid`` in
        the cache (0 if it holds nothing)."""
        return self._rows.tokens(rid)

    def demand(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
               horizon: int = 0) -> Demand:
        """:meth:`StepPath.demand <kvchain.requests.step.StepPath.demand>` (its errors)."""
        return self.steps.demand(rid, extend, headroom, headroom_chunk, horizon)

    def demand_pair(self, rid: int, extend: int, headroom: int = 0, headroom_chunk: int = 1,
                    horizon: int = 0) -> tuple[Demand, Demand]:
        """:meth:`StepPath.demand_pair <kvchain.requests.step.StepPath.demand_pair>`."""
        return self.steps.demand_pair(rid, extend, headroom, headroom_chunk, horizon)

    @property
    def num_requests(self) -> int:
        """Requests holding pages."""
        return len(self._requests)

    # --- prefix cache (:class:`CacheGlue`, :class:`Attach`) ----------------------------------

    def points_for(self, keys: Sequence[int] | None, prompt_tokens: int, after: int = 0,
                   junction: int = 0) -> tuple[int, ...]:
        """:meth:`CacheGlue.points_for`: resume points a request with these keys and a
        prompt of ``prompt_tokens`` tokens saves (its errors)."""
        return self._glue.points_for(keys, prompt_tokens, after, junction)

    def cached_tokens(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """:meth:`CacheGlue.cached_tokens`: tokens a prompt would hit now (a pure match; its
        errors)."""
        return self._glue.cached_tokens(keys, prompt_tokens)

    def chunk_cut(self, rid: int) -> int:
        """:meth:`Attach.chunk_cut <kvchain.requests.attach.Attach.chunk_cut>`."""
        return self.attachments.chunk_cut(rid)

    def attach(self, rid: int, keys: Sequence[int], prompt_tokens: int,
               save_points: bool = True, max_gap: int = 0) -> int:
        """:meth:`Attach.attach <kvchain.requests.attach.Attach.attach>` (hit tokens)."""
        return self.attachments.attach(rid, keys, prompt_tokens, save_points, max_gap)

    def recompute_tokens(self, rid: int) -> int:
        """:meth:`Attach.recompute_tokens <kvchain.requests.attach.Attach.recompute_tokens>`."""
        return self.attachments.recompute_tokens(rid)

    def partial_tokens(self, rid: int) -> int:
        """:meth:`CacheGlue.partial_tokens`: hit tokens ``rid`` shares but recomputes."""
        return self._glue.partial_tokens(rid)

    def detach(self, rid: int) -> None:
        """:meth:`Attach.detach <kvchain.requests.attach.Attach.detach>` (its errors)."""
        self.attachments.detach(rid)

    def touch(self, rid: int) -> None:
        """:meth:`Attach.touch <kvchain.requests.attach.Attach.touch>`."""
        self.attachments.touch(rid)

    def hit_holds(self, rid: int) -> Demand:
        """:meth:`Attach.hit_holds <kvchain.requests.attach.Attach.hit_holds>`."""
        return self.attachments.hit_holds(rid)

    def hit_tokens(self, rid: int) -> int:
        """:meth:`CacheGlue.hit_tokens`: tokens of ``rid`` served by the cache."""
        return self._glue.hit_tokens(rid)

    def shared_by_others(self, rid: int) -> int:
        """:meth:`Attach.shared_by_others <kvchain.requests.attach.Attach.shared_by_others>`."""
        return self.attachments.shared_by_others(rid)

    # --- retraction by host copy (:class:`Suspensions`; the scheduler's calls) -------------

    def suspend(self, rid: int, host: HostSide) -> Suspended:
        """:meth:`Suspensions.suspend` (its errors)."""
        return self.suspensions.suspend(rid, host)

    def suspend_bytes(self, rid: int) -> int:
        """:meth:`Suspensions.suspend_bytes`."""
        return self.suspensions.suspend_bytes(rid)

    def resume_demand(self, rid: int) -> Demand:
        """:meth:`Suspensions.resume_demand` (its errors)."""
        return self.suspensions.resume_demand(rid)

    def audit_host(self, host: HostSide) -> None:
        """:meth:`Suspensions.audit` (its errors)."""
        self.suspensions.audit(host)

    def _check_resumes(self, resumes: Sequence[int], ids: tuple[int, ...]
                       ) -> tuple[Suspended, ...]:
        return self.suspensions.check_resumes(resumes, ids)

    def _restore(self, sus: Suspended, vids: Sequence[Sequence[int]]) -> None:
        self.suspensions.restore(sus, vids)

    # --- the step (:class:`StepPath`) -------------------------------------------------------

    def decode_demands(self, rids: Sequence[int], drafts: int = 0) -> DecodeBatch:
        """:meth:`StepPath.decode_demands <kvchain.requests.step.StepPath.decode_demands>`:
        the decode batch's demands, its unpriced plan (its errors)."""
        return self.steps.decode_demands(rids, drafts)

    def plan(self, batch: Sequence[tuple[int, int]] | StepPlan,
             demands: Sequence[Demand] | None = None, resumes: Sequence[int] = (),
             quote: Quote | None = None) -> StepPlan:
        """:meth:`StepPath.plan <kvchain.requests.step.StepPath.plan>`: the step's one
        plan, validated and priced once (its errors)."""
        return self.steps.plan(batch, demands, resumes, quote)

    def apply(self, plan: StepPlan) -> Demand:
        """:meth:`StepPath.apply <kvchain.requests.step.StepPath.apply>`: realize a plan in
        one take (its errors). Returns the demand taken."""
        return self.steps.apply(plan)

    def allocate(self, batch: Sequence[tuple[int, int]],
                 demands: Sequence[Demand] | None = None, quote: Quote | None = None,
                 resumes: Sequence[int] = ()) -> Demand:
        """``apply(plan(batch, demands, resumes, quote))``: take the pages a batch needs to
        compute its tokens, in one chain take (none when the batch needs no page: an empty
        take binds nothing), together with the load-back of the suspended requests
        ``resumes`` (:meth:`suspend`): the take's demand is the batch's plus each resume's
        :attr:`Suspended.demand`, so one quote prices both.

        Args:
            batch: ``(request id, tokens to compute)`` pairs (a prefill chunk, or 1 for a
                decode); each request at most once.
            demands: the batch's demands if the caller just computed them (:meth:`plan`).
            quote: the allocator's quote (from its ``price``) of the summed demand, if the
                caller has it; a quote priced before the chain's epoch moved is dropped and
                the demand priced again.
            resumes: suspended requests to load back in this take (none of them in
                ``batch``): each gets new pages at the row entries it held, its host bytes
                copied into them (when its suspension moved bytes), and its host slots
                freed; it holds its pages again from then on (it computes nothing in this
                take: its next tokens are a later batch's).

        Returns:
            The summed demand that was taken (the batch's plus the resumes').

        Raises:
            InvalidDemandError, BufferArgumentError, ForgedQuoteError: as :meth:`plan`.
            ForgedQuoteError: ``quote`` was not issued by the allocator for this demand.
            CapacityError: the batch does not fit.

            On every error the chain and every request are as before.
        """
        return self.apply(self.plan(batch, demands, resumes, quote))

    def commit_decodes(self, rids: Sequence[int]) -> int:
        """:meth:`StepPath.commit_decodes
        <kvchain.requests.step.StepPath.commit_decodes>`: one token committed for each of
        ``rids`` (its errors). Returns window pages released."""
        return self.steps.commit_decodes(rids)

    def decode_run(self, rids: Sequence[int], steps: int) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`StepPath.decode_run <kvchain.requests.step.StepPath.decode_run>` (its
        errors)."""
        return self.steps.decode_run(rids, steps)

    def skip_decodes(self, rids: Sequence[int], steps: int) -> None:
        """:meth:`StepPath.skip_decodes <kvchain.requests.step.StepPath.skip_decodes>`
        (its errors)."""
        self.steps.skip_decodes(rids, steps)

    # --- commits (:class:`Commits`, :class:`Speculation`) -----------------------------------

    def commit(self, rid: int, tokens: int) -> int:
        """:meth:`Commits.commit <kvchain.requests.commits.Commits.commit>` (its errors)."""
        return self.commits.commit(rid, tokens)

    def verify(self, rids: Sequence[int], accepted: Sequence[int] | np.ndarray,
               drafts: int) -> int:
        """:meth:`Speculation.verify <kvchain.requests.speculative.Speculation.verify>`:
        settle a speculative step (its errors). Returns pages released."""
        return self.speculation.verify(rids, accepted, drafts)

    def audit_settled(self, rids: Iterable[int]) -> None:
        """:meth:`Audit.settled <kvchain.requests.audit.Audit.settled>` (AuditError)."""
        self.audits.settled(rids)

    def release_window_tail(self, rid: int) -> int:
        """:meth:`Commits.release_window_tail
        <kvchain.requests.commits.Commits.release_window_tail>` (its errors)."""
        return self.commits.release_window_tail(rid)

    def reclaim_window_pages(self, rids: Iterable[int]) -> int:
        """:meth:`Commits.reclaim_window_pages
        <kvchain.requests.commits.Commits.reclaim_window_pages>`."""
        return self.commits.reclaim_window_pages(rids)

    def free(self, rid: int, insert: bool = True) -> int:
        """:meth:`Commits.free <kvchain.requests.commits.Commits.free>` (its errors)."""
        return self.commits.free(rid, insert)

    # --- kernels (:class:`Reads`) ------------------------------------------------------------

    def page_table(self, rid: int, band: int) -> np.ndarray:
        """:meth:`Reads.page_table <kvchain.requests.reads.Reads.page_table>` (its errors)."""
        return self.reads.page_table(rid, band)

    # --- integrity (:class:`Audit`) ---------------------------------------------------------

    def audit(self) -> None:
        """:meth:`Audit.pages <kvchain.requests.audit.Audit.pages>` (AuditError)."""
        self.audits.pages()
