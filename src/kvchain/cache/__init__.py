"""The prefix cache: content keys per page (:mod:`kvchain.cache.keys`) and the radix tree
over the chain's pages of every band (:class:`kvchain.cache.radix.PrefixCache`, the facade
that composes :mod:`~kvchain.cache.points`, :mod:`~kvchain.cache.nodes`,
:mod:`~kvchain.cache.core`, :mod:`~kvchain.cache.order`, :mod:`~kvchain.cache.tree`,
:mod:`~kvchain.cache.insert`, :mod:`~kvchain.cache.pins`, :mod:`~kvchain.cache.audit` and
:mod:`~kvchain.cache.evict`), with its eviction order kept incrementally and published to
the planner as the evictable supply, and the reference counts of the window pages running
requests read (:mod:`kvchain.cache.page_refs`)."""
