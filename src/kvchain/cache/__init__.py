"""The prefix cache: content keys per page (:mod:`kvchain.cache.keys`) and the radix tree
over the chain's pages of every band, with its eviction order kept incrementally and
published to the planner as the evictable supply (:mod:`kvchain.cache.radix`), and the
reference counts of the window pages running requests read (:mod:`kvchain.cache.page_refs`)."""
