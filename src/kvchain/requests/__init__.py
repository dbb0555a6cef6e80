"""The request layer: each request's pages on the chain and its demands (``demand`` is the
one demand function over the band policies of :mod:`kvchain.bands`, which sit below the
prefix cache and this layer alike); ``table`` holds every request's pages once, ``manager``
is the :class:`~kvchain.requests.manager.KVManager` on it, ``cache_glue`` its prefix-cache
part; ``lookup``, ``suspend``, ``speculative``, ``reads`` and ``audit`` hold the parts it
owns (slot lookups, retraction by host copy, the verify, read views, audits).
"""
