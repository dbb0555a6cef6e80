"""The prefix cache's part of the request layer: a request's hit (its shared pages, locks
and pins), its resume points (window tails kept, state checkpoints saved), the insert of
its prompt's pages at the end of every prefill chunk that completes whole pages, and what
it hands back when it ends. The manager
calls these at fixed points; without a cache every call is a no-op."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from kvchain.alloc.allocator import Allocator, EvictingAllocator
from kvchain.alloc.snapshot import CopyPages
from kvchain.bands.geometry import RequestGeometry
from kvchain.cache.radix import Hit, Node, PrefixCache
from kvchain.errors import ConfigError, InvalidDemandError, InvalidRequestError
from kvchain.requests.batch import check_rid
from kvchain.requests.cache_audit import audit_glue
from kvchain.requests.cache_insert import prompt_offer, retained, take_adopted
from kvchain.requests.cache_port import CachePort
from kvchain.requests.demand import tail_spans
from kvchain.requests.prompt_keys import check_page_keys, check_prompt_tokens
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts


class CacheGlue:
    """The prefix-cache glue of one :class:`~kvchain.requests.manager.KVManager`.

    Args:
        chain: the manager's allocator.
        cache: its prefix cache, or ``None``.
        geom: the chain's request geometry.
        table: the manager's request table.

    Attributes:
        cow_state_copies, cow_bytes: cache checkpoints copied into a working state slot,
            and their bytes.
        checkpoints_saved: state checkpoint slots taken at resume points.
        junctions_saved: prefills that computed their junction point.
        prompts_inserted: prompts inserted whole (at the end of their prefill).
        chunk_inserts: inserts of a prompt's pages so far, one per prefill chunk that
            completed whole pages (the last one inserts the whole prompt).

    Every window and chunked-local band is handled alike, each by its own policy
    (``geom.windows``): its hit tail ``[policy.resume_start(h), h)`` shared and pinned, its
    kept tails, its pages handed to the cache at the insert.

    Raises:
        ConfigError: a cache on an allocator without an evictor hook.
    """

    def __init__(self, chain: Allocator, cache: PrefixCache | None, geom: RequestGeometry,
                 table: RequestTable) -> None:
        self.chain, self.geom, self.table = chain, geom, table
        #: the cache as the request layer sees it (:class:`CachePort`: the methods the glue
        #: calls and nothing else), or ``None``
        self.cache: CachePort | None = cache
        self.cow_state_copies = 0
        self.cow_bytes = 0
        self.checkpoints_saved = 0
        self.junctions_saved = 0
        self.prompts_inserted = 0
        self.chunk_inserts = 0
        # rid -> (hit pages, gap pages) at attach (the cache's pages before it; the state
        # resumed after hit - gap pages)
        self._hits: dict[int, tuple[int, int]] = {}
        self._pointed: set[int] = set()  # requests with resume points still to come
        self._uninserted: set[int] = set()  # requests whose prompt is not in the cache yet
        # rid -> its hit lock, for requests whose prompt is inserted (``handle`` is then
        # their prompt lock).
        self._hit_locks: dict[int, Node | None] = {}
        # requests whose hit's checkpoint is still to copy into their own slot (cow_src)
        self._copying: set[int] = set()
        if cache is not None:
            if not isinstance(chain, EvictingAllocator):
                raise ConfigError("the prefix cache needs an allocator with an evictor hook "
                                  "(a Chain or a baseline's PoolAllocator)")
            chain.set_evictor(cache)

    # --- queries -----------------------------------------------------------------------------

    def points_for(self, keys: Sequence[int] | None, prompt_tokens: int, after: int = 0,
                   junction: int = 0) -> tuple[int, ...]:
        """The resume points (page counts, sorted) a request with these page keys and a
        prompt of ``prompt_tokens`` tokens saves past ``after`` pages (:meth:`attach`
        keeps them; :meth:`KVManager.points_for`). ``prompt_tokens`` (the prompt's length
        ``L``) is required: a block-aligned prompt keeps its resend point ``len(keys) -
        1`` too (:func:`~kvchain.cache.radix.resend_point`), and the demand a caller
        counts for the points must be the points the request saves. Pure: nothing
        changes.

        Args:
            keys: the prompt's page keys, one int per whole page (the rule of
                :meth:`KVManager.attach`, :func:`~kvchain.requests.prompt_keys.check_page_keys`),
                or ``None``: a request without keys saves no point.
            prompt_tokens: ``L``, an int >= 1.
            after: pages the request already holds (its hit): only points past it count;
                an int in ``[0, n]``, ``n = L // P`` the prompt's whole pages.
            junction: a junction point to keep as well (:meth:`PrefixCache.resume_points`),
                in pages: 0 for none, else an int in ``[1, n]``.

        Returns:
            The points, ``()`` without a cache or keys.

        Raises:
            InvalidRequestError: keys other than ``None`` or one int per whole page, a
                ``prompt_tokens`` that is not an int >= 1, or an ``after`` or
                ``junction`` that is not an int (a bool included) in ``[0, n]``.
        """
        page = self.geom.page_size
        if keys is None:
            n = check_prompt_tokens(None, prompt_tokens, "points_for") // page
        else:
            keys = check_page_keys(None, keys, prompt_tokens, page, "points_for")
            n = len(keys)
        for name, v in (("after", after), ("junction", junction)):
            if type(v) is not int or not 0 <= v <= n:
                raise InvalidRequestError(f"points_for: {name} must be an int in [0, {n}] "
                                          f"(pages of the prompt), got {v!r}")
        if self.cache is None or not keys:
            return ()
        pts = self.cache.resume_points(n, prompt_tokens=prompt_tokens)[0]
        if junction and junction not in pts:
            pts = tuple(sorted((*pts, junction)))
        return tuple(q for q in pts if q > after)

    def cached_tokens(self, keys: Sequence[int], prompt_tokens: int) -> int:
        """Tokens of a prompt the cache would serve now: its hit's pages times ``P`` (a
        pure match, :meth:`PrefixCache.match`; nothing is locked or touched;
        :meth:`KVManager.cached_tokens`).

        Args:
            keys: the prompt's page keys, one int per whole page (the rule of
                :meth:`KVManager.attach`, :func:`~kvchain.requests.prompt_keys.check_page_keys`).
            prompt_tokens: ``L``, an int >= 1.

        Returns:
            The tokens, 0 without a cache.

        Raises:
            InvalidRequestError: keys other than one int per whole page of the prompt, or
                a ``prompt_tokens`` that is not an int >= 1.
        """
        keys = check_page_keys(None, keys, prompt_tokens, self.geom.page_size,
                               "cached_tokens")
        if self.cache is None or not keys:
            return 0
        return self.cache.match(keys, prompt_tokens).pages * self.geom.page_size

    def hit_tokens(self, rid: int) -> int:
        """See :meth:`KVManager.hit_tokens` (InvalidDemandError: not an int id)."""
        check_rid(rid)
        h, gap = self._hits.get(rid, (0, 0))
        return (h - gap) * self.geom.page_size

    def partial_tokens(self, rid: int) -> int:
        """See :meth:`KVManager.partial_tokens` (InvalidDemandError: not an int id)."""
        check_rid(rid)
        return self._hits.get(rid, (0, 0))[1] * self.geom.page_size

    def reaches_point(self, ids: tuple[int, ...], requests: Mapping[int, CacheFacts]) -> bool:
        """Whether the next token of one of ``ids`` reaches one of its resume points."""
        if not self._pointed:
            return False
        p = self.geom.page_size
        for rid in self._pointed.intersection(ids):
            facts = requests[rid]
            if int(self.table.tokens[facts.slot]) + 1 in {q * p for q in facts.points}:
                return True
        return False

    def points_ahead(self, ids: tuple[int, ...], requests: Mapping[int, CacheFacts]) -> bool:
        """Whether one of ``ids`` has a resume point past its tokens."""
        p = self.geom.page_size
        return any(requests[rid].points[-1] * p > int(self.table.tokens[requests[rid].slot])
                   for rid in self._pointed.intersection(ids))

    def shared_by_others(self, rid: int, facts: CacheFacts) -> int:
        """Full pages of ``rid``'s cached prefix that another request locks too: the pages
        of every node on its locked path whose lock count exceeds its own locks there (its
        hit lock, and its prompt lock once inserted). 0 without a cache or a lock."""
        if self.cache is None or facts.handle is None:
            return 0
        own: dict[int, int] = {}
        for handle in (facts.handle, self._hit_locks.get(rid)):
            n = handle
            while n is not None and n.nid:
                own[n.nid] = own.get(n.nid, 0) + 1
                n = n.parent
        pages = 0
        n = facts.handle  # the deepest: the prompt lock's path holds the hit's
        while n is not None and n.nid:
            if n.lock > own.get(n.nid, 0):
                pages += len(n.keys)
            n = n.parent
        return pages

    def lock_holds(self, handle: Node | None) -> tuple[int, ...]:
        """Pages per band a hit lock at ``handle`` keeps locked beyond its full pages
        (:meth:`PrefixCache.lock_holds`); zeros without a cache or a lock."""
        if self.cache is None or handle is None:
            return (0,) * self.geom.num_bands
        return tuple(self.cache.lock_holds(handle))

    def may_insert(self, ids: tuple[int, ...]) -> bool:
        """Whether a commit of one of ``ids`` may insert its prompt (not inserted yet)."""
        return bool(self._uninserted) and not self._uninserted.isdisjoint(ids)

    # --- attach / detach ------------------------------------------------------------------

    def attach(self, rid: int, facts: CacheFacts, keys: tuple[int, ...], prompt_tokens: int,
               save_points: bool, max_gap: int = 0) -> int:
        """Lock ``rid``'s hit and write it into its (new) row: the hit's full pages and
        window tail by reference (``shared``), its resume points and kept tails; pin what
        it reads of the cache (its window tail, the checkpoint it resumes from). Returns
        the hit tokens (the pages it shares, ``H P``).

        With ``max_gap`` pages (> 0) the hit may be *partial* (:meth:`PrefixCache.match`):
        the row holds the cache's pages ``[0, H)`` exactly as for a hit at ``H`` (so every
        demand, release and the insert are those of that hit), the state resumes from the
        checkpoint at ``C = H - gap`` (``facts.cow_at``; none at 0: a fresh slot) and
        ``facts.gap`` tokens are recomputed by its first chunk before the chunk's own
        tokens. Its junction point is found from ``C`` (where its state resumes), so a
        junction at ``H`` is kept too: the state passes there at the gap's end."""
        facts.keys = keys
        cache = self.cache
        if cache is None:
            return 0
        hit = self._match(keys, prompt_tokens, save_points, max_gap)
        # the hit locked, its window tails and its checkpoint (until copied) referenced
        handle = facts.handle = cache.acquire(hit)
        g, h, slot = self.geom, hit.pages, facts.slot
        table = self.table
        table.tokens[slot] = h * g.page_size
        table.shared[slot] = h
        for band in g.fulls:
            table.set_row(band, slot, 0, hit.full.get(band, ()))
        if h:
            for pol in g.windows:
                table.set_row(pol.band, slot, hit.window_first[pol.band], hit.window[pol.band])
        facts.cow_src = hit.checkpoint
        facts.cow_at = h - hit.gap
        facts.gap = hit.gap * g.page_size
        self._hits[rid] = (h, hit.gap)
        if h < len(keys):
            self._uninserted.add(rid)
        if hit.checkpoint >= 0 and handle is not None:
            self._copying.add(rid)
        if save_points:
            own, junction = cache.resume_points(len(keys), facts.cow_at, hit.matched,
                                                prompt_tokens)
            facts.points = self.points_for(keys, prompt_tokens, h, junction)
            if hit.gap and h < len(keys) and (junction == h or h in own):
                # the state passes H at the gap's end (whose tails the cache holds): keep it
                # (for the insert at its prefill's end; a prompt cached whole has none)
                facts.points = (h, *facts.points)
            facts.cut = junction * g.page_size
        if facts.points:
            self._pointed.add(rid)
        facts.tails = tail_spans(g, facts.points, h)
        facts.retain = retained(g, facts.tails)
        return h * g.page_size

    def _match(self, keys: tuple[int, ...], prompt_tokens: int, save_points: bool,
               max_gap: int) -> Hit:
        """:meth:`PrefixCache.match` of the prompt, save that a partial hit of the prompt
        whole (``H`` its last keyed page) ending at one of its resume points stops one
        page short: the cache has no checkpoint at ``H`` (else the hit were not partial)
        and a prompt cached whole inserts nothing, so that checkpoint would never be
        saved and later prompts through it would resume lower; one page short, the
        prefill's insert saves it (the gap is recomputed either way; one full page more
        of its own)."""
        cache = self.cache
        assert cache is not None
        hit: Hit = cache.match(keys, prompt_tokens, max_gap)
        if hit.gap and save_points and hit.pages == len(keys) and hit.pages in (
                cache.resume_points(len(keys), hit.pages - hit.gap, hit.matched,
                                    prompt_tokens)[0]):
            hit = cache.match(keys, hit.pages * self.geom.page_size, max_gap)
        return hit

    def detach(self, rid: int, facts: CacheFacts) -> None:
        """Check that ``rid`` took no page of its own since :meth:`attach`, then drop its
        pins and its lock, and what the glue keeps of it (:meth:`forget`).

        Raises:
            InvalidRequestError: it did.
        """
        table, slot = self.table, facts.slot
        shared = int(table.shared[slot])
        took = bool(facts.ckpts) or any(facts.kept.values())
        for pol in self.geom.policies:
            first, end = table.span(pol.band, slot)
            took |= end > 0 if pol.per_request else (end > first and end > shared)
        if took:
            raise InvalidRequestError(f"request {rid} took pages since it was attached")
        if self.cache is not None:
            self._unpin_all(facts)
            self.cache.unlock(facts.handle)
        self.forget(rid)

    def forget(self, rid: int) -> None:
        """Drop what the glue keeps of ``rid`` (it left the manager)."""
        self._hits.pop(rid, None)
        self._copying.discard(rid)
        self._pointed.discard(rid)
        self._uninserted.discard(rid)

    def touch(self, facts: CacheFacts) -> None:
        """LRU touch of the request's hit (no-op without one)."""
        if self.cache is not None and facts.handle is not None:
            self.cache.touch(facts.handle, self._window_first(facts))

    def _window_first(self, facts: CacheFacts) -> int:
        """The least first held page over the window bands (0 without one): the cache's
        nodes at or after it hold window pages the request reads (:meth:`PrefixCache.touch`)."""
        return min((int(self.table.first[pol.band, facts.slot]) for pol in self.geom.windows),
                   default=0)

    # --- pins --------------------------------------------------------------------------------

    def _drop_checkpoint(self, facts: CacheFacts) -> None:
        """Drop the request's reference to the checkpoint its hit resumes from (copied
        into its own slot, or given up): the state band's reference counts, as its window
        pages' (:meth:`PrefixCache.unpin_pages`)."""
        if facts.cow_src >= 0 and self.cache is not None and self.geom.state is not None:
            self.cache.unpin_pages(self.geom.state, [facts.cow_src])
        facts.cow_src = -1

    def _unpin_all(self, facts: CacheFacts) -> None:
        """Drop every reference the request holds: the cache's window pages in its window
        (read from its rows, by id) and the checkpoint it has not copied yet."""
        cache = self.cache
        if cache is None or facts.handle is None:
            return
        shared = int(self.table.shared[facts.slot])
        for pol in self.geom.windows:
            first, end = self.table.span(pol.band, facts.slot)
            if end > first and first < shared:
                cache.unpin_pages(pol.band,
                                  self.table.live(pol.band, facts.slot)[:min(shared, end) - first])
        self._drop_checkpoint(facts)

    def unpin_pages(self, band: int, vids: np.ndarray) -> None:
        """Rows of a decode batch dropped the cache's window pages ``vids`` of ``band``
        (int64, read from the rows: one reference each) from their fronts: drop those
        references in one batch (:meth:`PrefixCache.unpin_pages`)."""
        if self.cache is not None and vids.size:
            self.cache.unpin_pages(band, vids)

    # --- pages in and out ------------------------------------------------------------------

    def take_slots(self, band: int, rows: np.ndarray, rids: Sequence[int],
                   extends: Sequence[int], counts: Sequence[int], vids: Sequence[int],
                   requests: Mapping[int, CacheFacts]) -> None:
        """State slots granted to the requests in ``rows`` (``counts[i]`` each, in order):
        a request without slots takes its working slot(s) first (then the cache's
        checkpoint it resumes from is copied there), then one checkpoint slot per resume
        point its chunk of ``extends[i]`` tokens reaches (the forward writes the state
        there).

        Raises:
            InvalidDemandError: a grant that does not match the points reached.
        """
        table, p, n_slots = self.table, self.geom.page_size, self.geom.state_slots
        cut = 0
        for slot, rid, extend, n in zip(rows.tolist(), rids, extends, counts, strict=True):
            got = list(vids[cut:cut + n])
            cut += n
            facts = requests[rid]
            if not table.rowlen[band, slot]:
                table.put_row(band, slot, 0, got[:n_slots])
                got = got[n_slots:]
                if facts.cow_src >= 0:  # the take copied it into the first slot (copies)
                    self.cow_state_copies += 1
                    self.cow_bytes += self.chain.layout.bands[band].page_bytes
                    self._copying.discard(rid)
                    self._drop_checkpoint(facts)
            tokens = int(table.tokens[slot]) - facts.gap  # a partial hit's gap runs first
            reached = [q for q in facts.points if tokens < q * p <= tokens + facts.gap + extend]
            if len(reached) != len(got):
                raise InvalidDemandError(f"request {rid}: {len(got)} checkpoint slots for "
                                         f"{len(reached)} resume points")
            for q, v in zip(reached, got, strict=True):
                facts.ckpts[q] = v
            self.checkpoints_saved += len(got)

    def copies(self, ids: tuple[int, ...], slots: np.ndarray, nonzero: Sequence[int],
               matrix: np.ndarray, requests: Mapping[int, CacheFacts]) -> tuple[CopyPages, ...]:
        """The copy actions of a take for the batch ``ids`` (``slots`` their rows,
        ``nonzero`` the positions of its non-empty demands, ``matrix`` those demands,
        ``[len(nonzero), bands]``): every request that takes its first state slots in it
        and resumes from a cache checkpoint gets that checkpoint (``cow_src``) copied
        into its working slot, the first of its state pages in the grant (the take's
        pages of a band are cut in batch order: :meth:`take_slots`). At most one
        :class:`~kvchain.alloc.snapshot.CopyPages` (the state band's); none without a
        checkpoint to copy (most steps: one set test)."""
        band = self.geom.state
        if (not self._copying or band is None or not len(nonzero)
                or self._copying.isdisjoint(ids)):
            return ()
        src: list[int] = []
        dst: list[int] = []
        at = 0
        for pos, n in zip(nonzero, matrix[:, band].tolist(), strict=True):
            if not n:
                continue
            facts = requests.get(ids[pos])
            if (facts is not None and facts.cow_src >= 0
                    and not self.table.rowlen[band, int(slots[pos])]):
                src.append(facts.cow_src)
                dst.append(at)
            at += n
        return (CopyPages(band, tuple(src), tuple(dst)),) if src else ()

    def drop_window_pages(self, facts: CacheFacts, band: int, first: int,
                          vids: np.ndarray) -> None:
        """Hand back the window pages ``vids`` (page indices from ``first``) a request's
        window-tail release took out of its row: the cache's shared ones are unpinned,
        the ones kept for a resume point move to ``kept``, the rest are released."""
        shared = int(self.table.shared[facts.slot])
        retain = facts.retain.get(band, frozenset())
        if not (shared or retain):
            self.chain.release(band, vids)
            return
        # Page index first + j is vids[j]: the ones below ``shared`` are the cache's (the
        # request stops reading them: unpin), the rest its own, kept or released (set
        # operations over the page indices, not a loop per page).
        lo = max(shared, first)
        out = own = vids[lo - first:]
        if retain:
            kept = facts.kept.setdefault(band, {})
            span = range(lo, lo + len(own))
            if retain.issuperset(span):  # every page kept (a tail covering the window)
                kept.update(zip(span, own.tolist(), strict=True))
                out = own[:0]
            elif not retain.isdisjoint(span):
                idx = sorted(retain.intersection(span))  # kept, in page order
                pos = np.array(idx, dtype=np.int64) - lo
                kept.update(zip(idx, own[pos].tolist(), strict=True))
                out = np.delete(own, pos)
        if first < shared and self.cache is not None and facts.handle is not None:
            self.cache.unpin_pages(band, vids[:shared - first])
        self.chain.release(band, out)

    def count_junction(self, facts: CacheFacts, now: int, new: int) -> None:
        """Count a prefill that computes its junction point (``now - gap < cut <= new``:
        a partial hit's gap is computed by its first chunk too)."""
        if facts.cut and now - facts.gap < facts.cut <= new:
            self.junctions_saved += 1

    def maybe_insert(self, rid: int, facts: CacheFacts, tokens: int) -> None:
        """Insert the prompt pages a commit completed: at the end of every prefill chunk
        that completes whole pages past what the cache holds of the prompt
        (``min(tokens // P, len(keys)) > shared``), pages ``[0, that)`` (incremental
        insertion; the last such commit inserts the whole prompt)."""
        if rid not in self._uninserted or not facts.keys:
            return
        n = min(tokens // self.geom.page_size, len(facts.keys))
        if n > int(self.table.shared[facts.slot]):
            self._insert_prompt(rid, facts, n)

    def _insert_prompt(self, rid: int, facts: CacheFacts, n: int) -> None:
        """Insert the request's prompt pages ``[0, n)`` (``shared < n <= len(keys)``) into
        the cache now and hand over what it only kept for the cache up to there.
        Afterwards it holds pages ``[0, n)`` by reference (``shared = n``) under a prompt
        lock of the path so far (an earlier prompt lock, of a shorter path, is dropped: the
        lock moves with the inserted prefix; its hit lock stays: the hit path keeps its
        tails while it runs); its window pages below ``n`` are the cache's, pinned while
        its window covers them; the window tails and the checkpoints of the resume points
        ``<= n`` are evictable cache units at once, so its reservation no longer holds
        them (:meth:`~kvchain.bands.policies.BandPolicy.resume_pages`). It runs after the
        commit's window-tail release, so the window pages offered are exactly the kept
        tails and the next token's window below ``n`` (a kept page is always a tail of a
        point ``<= n``: a later point's tail lies inside the next token's window). Where
        the cache already held a page (another request inserted the same prefix
        meanwhile), the request switches to the cache's copy and its own is released."""
        cache, keys, table = self.cache, facts.keys, self.table
        assert cache is not None and keys is not None
        h = int(table.shared[facts.slot])
        offer = prompt_offer(self.geom, table, facts, n)
        ad = cache.adopt(keys[:n], h, offer.full, offer.windows, offer.ckpts, offer.reading,
                         own_from=self._hits.get(rid, (h, 0))[0])
        if rid in self._hit_locks:  # an earlier chunk's prompt lock: the new one covers it
            cache.unlock(facts.handle, tails=False)
        else:
            self._hit_locks[rid] = facts.handle
        take_adopted(self.geom, table, facts, n, offer, ad)
        if not facts.points:
            self._pointed.discard(rid)
        self.chunk_inserts += 1
        if n == len(keys):
            self._uninserted.discard(rid)
            self.prompts_inserted += 1
        for band, ids in enumerate(ad.dups):
            if ids:
                self.chain.release(band, ids)

    def release_held(self, rid: int, facts: CacheFacts, out: list[list[int]],
                     insert: bool) -> None:
        """A request ends: add what it kept for the cache to its pages to release ``out``
        (per band; its shared pages already left out), drop its pins and its locks (a
        finished one, ``insert``, touches its prompt's path first), and what the glue
        keeps of it (:meth:`forget`)."""
        self.forget(rid)
        cache = self.cache
        if facts.keys is None or cache is None:
            return
        g = self.geom
        for band, kept in facts.kept.items():
            out[band].extend(kept.values())
        if g.state is not None:
            out[g.state][:0] = facts.ckpts.values()
        self._unpin_all(facts)
        if insert and facts.handle is not None:
            cache.touch(facts.handle, self._window_first(facts))
        if rid in self._hit_locks:
            cache.unlock(facts.handle, tails=False)
            cache.unlock(self._hit_locks.pop(rid))
        else:
            cache.unlock(facts.handle)

    # --- integrity -------------------------------------------------------------------------

    def held_pages(self) -> list[list[int]] | None:
        """The pages the cache holds per band (``None`` without a cache)."""
        return self.cache.held_pages() if self.cache is not None else None

    def kept_pages(self, facts: CacheFacts, held: list[list[int]]) -> None:
        """Add the pages the request holds for the cache (kept window pages, saved
        checkpoints) to ``held`` (per band)."""
        g = self.geom
        for band, kept in facts.kept.items():
            held[band].extend(kept.values())
        if facts.ckpts and g.state is not None:
            held[g.state].extend(facts.ckpts.values())

    def audit(self, requests: Mapping[int, CacheFacts]) -> None:
        """:func:`~kvchain.requests.cache_audit.audit_glue` of these requests (the cache's
        own audit with their locks and pins; raises AuditError)."""
        if self.cache is not None:
            audit_glue(self.cache, self.geom, self.table, requests, self._hit_locks)
