"""The request layer's side of the prefix cache's audit: no request still holds what its
commits should have handed to the cache, every lock and pin the requests hold is told to
the cache's own audit (:meth:`PrefixCache.audit <kvchain.cache.radix.PrefixCache.audit>`),
and a request whose state has not resumed yet resumes where the cache keeps its
checkpoint. Read only.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvchain.bands.geometry import RequestGeometry
from kvchain.cache.radix import Node
from kvchain.errors import AuditError
from kvchain.requests.cache_port import CachePort
from kvchain.requests.table import RequestTable
from kvchain.requests.view import CacheFacts


def audit_glue(cache: CachePort, geom: RequestGeometry, table: RequestTable,
               requests: Mapping[int, CacheFacts], hit_locks: Mapping[int, Node | None],
               ) -> None:
    """The cache's own audit with the locks and pins the requests hold, and that no
    request still holds a window tail or checkpoint of a resume point its commits
    reached (incremental insertion hands them to the cache at the commit; the
    reservation counts none of them: :meth:`CacheGlue.maybe_insert`).

    Args:
        cache, geom, table: the glue's prefix cache, geometry and request table.
        requests: request id -> facts (every request holding pages).
        hit_locks: request id -> its hit lock, for the requests whose prompt is inserted
            (their ``handle`` is then their prompt lock).

    Raises:
        AuditError: as :meth:`PrefixCache.audit`; or a request holding kept window
            pages, or a checkpoint of a point ``q`` with ``q * P <=`` its tokens; or as
            :func:`check_resume`.
    """
    p = geom.page_size
    for rid, facts in requests.items():
        tokens = int(table.tokens[facts.slot])
        kept = sum(len(k) for k in facts.kept.values())
        late = [q for q in facts.ckpts if q * p <= tokens]
        if kept or late:
            raise AuditError(f"request {rid} at {tokens} tokens holds {kept} kept window "
                             f"pages and checkpoints {late} of resume points it reached: "
                             f"they were not handed to the cache at the commit")
    wpins: list[tuple[int, int]] = []
    cpins: list[int] = []
    locks: list[Node] = []
    prompt_locks: list[Node] = []
    for rid, facts in requests.items():
        if rid in hit_locks:
            hl = hit_locks[rid]
            if hl is not None:
                locks.append(hl)
            if facts.handle is not None:
                prompt_locks.append(facts.handle)
        elif facts.handle is not None:
            locks.append(facts.handle)
        if facts.handle is None:
            continue
        shared = int(table.shared[facts.slot])
        for pol in geom.windows:
            first = int(table.first[pol.band, facts.slot])
            wpins.extend((pol.band, v) for i, v in
                         enumerate(table.live(pol.band, facts.slot).tolist(), first)
                         if i < shared)
        if facts.cow_src >= 0:
            cpins.append(facts.cow_src)
        check_resume(cache, geom, table, rid, facts)
    cache.audit(locks, (wpins, cpins), prompt_locks)


def check_resume(cache: CachePort, geom: RequestGeometry, table: RequestTable, rid: int,
                 facts: CacheFacts) -> None:
    """Check that a request whose state has not resumed yet (a checkpoint to copy, or
    a partial hit's gap to recompute) resumes at a checkpoint it really has: its
    resume point plus its gap is where its pages end (``cow_at P + gap = tokens``),
    and the cache holds the checkpoint it will copy at ``cow_at`` on its locked path
    (or ``cow_at = 0``: a fresh state).

    Raises:
        AuditError: either fails (e.g. a gap not recomputed, or the state taken at
            ``H`` where the cache has no checkpoint).
    """
    if facts.cow_src < 0 and not facts.gap:
        return
    tokens = int(table.tokens[facts.slot])
    if facts.cow_at * geom.page_size + facts.gap != tokens:
        raise AuditError(f"request {rid}: its state resumes after {facts.cow_at} pages "
                         f"with {facts.gap} tokens to recompute, but its pages end at "
                         f"{tokens} tokens")
    if facts.cow_src >= 0:
        have = (cache.checkpoint_at(facts.handle, facts.cow_at)
                if facts.handle is not None and facts.cow_at else -1)
        if have != facts.cow_src:
            raise AuditError(f"request {rid}: resumes from checkpoint slot "
                             f"{facts.cow_src} after {facts.cow_at} pages, but the "
                             f"cache holds {have} there")
    elif facts.cow_at and geom.state is not None and \
            not table.rowlen[geom.state, facts.slot]:
        raise AuditError(f"request {rid}: resumes after {facts.cow_at} pages with no "
                         f"checkpoint to copy and no state slot")
