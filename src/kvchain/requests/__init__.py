"""The request layer: each request's pages on the chain and its demands (``demand`` is the
one demand function over the band policies of :mod:`kvchain.bands`, which sit below the
prefix cache and this layer alike); ``table`` holds every request's pages once, ``rows``
the requests by id over it, ``manager`` is the :class:`~kvchain.requests.manager.KVManager`
facade (the step: demands, the step plan, the take); ``lookup``, ``commits``, ``attach``,
``suspend``, ``speculative``, ``reads`` and ``audit`` hold the parts it delegates to (slot
lookups, commits and releases, prefix-cache hits, retraction by host copy, the verify,
read views, audits), each built over the rows, never the manager; ``cache_glue`` (with
``cache_insert`` and ``cache_audit``) is the prefix cache's part, which sees the cache
through ``cache_port``.
"""
