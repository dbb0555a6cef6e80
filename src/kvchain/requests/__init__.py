"""The request layer: each request's pages on the chain and its demands.

``policies`` (one formula set per band kind) and ``geometry`` (the page size and a policy
per band, read off a layout) sit just above the layout and below everything that prices a
request (the prefix cache included); ``demand`` is the one demand function over them.
This ``__init__`` imports nothing, so the cache may import the geometry without importing
the manager above it.
"""
