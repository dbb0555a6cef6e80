"""The memory managers compared: kvchain and three baselines, built for one model and buffer.

=============  ============================================================================
kvchain        :class:`~kvchain.alloc.chain.Chain` on :func:`~kvchain.layout.plan_layout`
               (P-token pages per class, bands that trade bytes, null pages).
fixed-pools    one pool per lifetime class, sized by the ratios engines ship (see
               :func:`fixed_pool_shares`); the same pages as kvchain, but a pool never lends
               bytes to another.
equal-page     one pool of equal-byte blocks shared by all classes, vLLM v1's hybrid
               allocator (see :func:`equal_page_geometry`); out-of-window pages are freed,
               one null page per window band.
ideal          exact bytes: one-token pages, no null pages, one shared pool: a request
               costs ``L x E_full + (window tokens) x E_win + (local tokens) x E_loc + S``
               bytes and admission fits iff all of them fit ``B`` (the physical limit).
=============  ============================================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvchain.alloc.allocator import Allocator
from kvchain.alloc.chain import Chain
from kvchain.baselines.pools import CapacityRule, PoolAllocator
from kvchain.errors import BufferTooSmallError, ConfigError
from kvchain.layout import (
    Anchor,
    BandLayout,
    ChainLayout,
    chain_anchors,
    chain_order,
    plan_layout,
    smallest_request_bytes,
)
from kvchain.model.layers import CacheClass, LifetimeClass

# SGLang server_args: ``--swa-full-tokens-ratio`` default 0.8 (window-pool tokens per
# full-pool token) and ``mamba_full_memory_ratio`` default 0.9 (mamba-pool bytes per
# full-pool byte), python/sglang/srt/server_args.py.
SWA_FULL_TOKENS_RATIO = 0.8
MAMBA_FULL_MEMORY_RATIO = 0.9
# vLLM ``HybridAttentionMambaModelConfig.verify_and_update_config``: the attention block
# size is raised to a multiple of the kernel's block alignment (16 tokens for the
# FlashAttention backend) until one attention page per layer holds a mamba state per layer
# (vllm/model_executor/models/config.py).
VLLM_KERNEL_BLOCK_ALIGNMENT = 16


class ManagerKind(StrEnum):
    """The memory managers ``kvchain compare`` runs."""

    KVCHAIN = "kvchain"
    FIXED_POOLS = "fixed-pools"
    EQUAL_PAGE = "equal-page"
    IDEAL = "ideal"


@dataclass(frozen=True, slots=True)
class ManagerSetup:
    """One memory manager, ready for a :class:`~kvchain.requests.manager.KVManager`.

    Attributes:
        kind: which manager.
        layout: its band geometry (page tokens and bytes per band).
        allocator: the chain or the baseline's :class:`PoolAllocator`.
        rule: one line stating its capacity rule with its numbers.
    """

    kind: ManagerKind
    layout: ChainLayout
    allocator: Allocator
    rule: str


@dataclass(frozen=True, slots=True)
class EqualPageGeometry:
    """vLLM v1's unified page for a model's classes.

    Attributes:
        group_size: layers per KV-cache group ``g``: the fewest layers of a class, or the
            most when every class has under 1.5x the fewest (vLLM
            ``_get_kv_cache_groups_uniform_page_size``, vllm/v1/core/kv_cache_utils.py).
        page_tokens: tokens per block of every token class.
        layer_page_bytes: bytes of one layer's page ``L`` (all layers padded to it).
        block_bytes: bytes of one block id ``g x L`` (one page of every layer of a group).
        groups: per class (layout order), groups ``ceil(n_c / g)``.
        page_bytes: per class, bytes one page of the class costs: ``groups x block_bytes``.
    """

    group_size: int
    page_tokens: int
    layer_page_bytes: int
    block_bytes: int
    groups: tuple[int, ...]
    page_bytes: tuple[int, ...]


def _ordered(classes: Sequence[CacheClass]) -> list[CacheClass]:
    """Classes in the chain's band order (as :func:`~kvchain.layout.plan_layout`)."""
    return chain_order(classes)


def equal_page_geometry(classes: Sequence[CacheClass], page_size: int = 16) -> EqualPageGeometry:
    """The equal-byte page of vLLM v1's hybrid allocator for ``classes``.

    Rule (vLLM v1, ``HybridKVCacheCoordinator`` over one ``BlockPool``): layers are split
    into groups of ``g`` layers; each group allocates block ids from one shared pool, and
    a block id is one page in every layer of its group, so every layer's page has the same
    bytes ``L``. Token classes use ``page_size`` tokens per block; with a state class the
    block grows to a multiple of 16 tokens until ``L >= S_layer`` and the state page is
    padded to ``L``. A token class of smaller per-layer bytes is padded to ``L`` too (vLLM
    scales its block instead; the bytes per token are the same).

    Example (Qwen3-Next-80B-A3B, 12 full layers of 2,048 B/token, 36 GDN layers of
    1,097,728 B): ``g = 12``, ``P = 16 x ceil(1,097,728 / (16 x 2,048)) = 544``,
    ``L = 1,114,112 B``; a full page (544 tokens) costs one block of 13,369,344 B and a
    request's state 3 blocks (40,108,032 B for 39,518,208 B of state).

    Raises:
        ConfigError: no classes or ``page_size < 1``.
    """
    if not classes or page_size < 1:
        raise ConfigError(f"equal pages need classes and page_size >= 1, got {page_size}")
    ordered = _ordered(classes)
    counts = [len(c.layers) for c in ordered]
    smallest, largest = min(counts), max(counts)
    group = largest if largest < smallest * 1.5 else smallest
    token_layer = max((max(la.nbytes for la in c.layers) for c in ordered if c.is_token_class),
                      default=0)
    state_layer = max((max(la.nbytes for la in c.layers) for c in ordered
                       if not c.is_token_class), default=0)
    tokens = page_size
    if token_layer and state_layer:
        align = VLLM_KERNEL_BLOCK_ALIGNMENT
        tokens = max(page_size, align * math.ceil(state_layer / (align * token_layer)))
    layer_page = max(tokens * token_layer, state_layer)
    block = group * layer_page
    groups = tuple(math.ceil(n / group) for n in counts)
    return EqualPageGeometry(group, tokens, layer_page, block, groups,
                             tuple(k * block for k in groups))


def fixed_pool_shares(classes: Sequence[CacheClass]) -> tuple[float, ...]:
    """Fractions of the buffer each class's own pool gets (layout order, sum 1).

    Rules (SGLang defaults): a state pool gets ``0.9 / 1.9`` of the buffer
    (``mamba_full_memory_ratio = 0.9``: state bytes = 0.9 x the rest); of the rest, a
    window (or chunked-local) pool holds ``0.8`` tokens per full-pool token
    (``--swa-full-tokens-ratio = 0.8``), so full gets ``E_full / (E_full + 0.8 E_win)``.

    Example: gpt-oss-120b (``E_full = E_win``): window 0.8 / 1.8 = 0.444, full 0.556.

    Several window (or local) classes: each holds ``0.8`` tokens per full-pool token
    (SGLang has one window pool; the ratio is applied to each), so full gets
    ``E_full / (E_full + 0.8 x sum(E_win))``; without a full class, window pools split
    the rest by bytes per token.
    """
    ordered = _ordered(classes)
    shares = [0.0] * len(ordered)
    rest = 1.0
    state = [i for i, c in enumerate(ordered) if c.lifetime is LifetimeClass.STATE]
    if state and len(ordered) > 1:
        shares[state[0]] = MAMBA_FULL_MEMORY_RATIO / (1 + MAMBA_FULL_MEMORY_RATIO)
        rest -= shares[state[0]]
    wins = [i for i, c in enumerate(ordered)
            if c.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL)]
    full = [i for i, c in enumerate(ordered) if c.lifetime is LifetimeClass.FULL]
    if wins and full:
        e_f = ordered[full[0]].bytes_per_token
        e_w = [SWA_FULL_TOKENS_RATIO * ordered[i].bytes_per_token for i in wins]
        shares[full[0]] = rest * e_f / (e_f + sum(e_w))
        for i, e in zip(wins, e_w, strict=True):
            shares[i] = rest * e / (e_f + sum(e_w))
    else:
        others = [i for i in range(len(ordered)) if i not in state or len(ordered) == 1]
        total_e = sum(max(ordered[i].bytes_per_token, 1) for i in others)
        for i in others:
            shares[i] = rest * max(ordered[i].bytes_per_token, 1) / total_e
    return tuple(shares)


def _fixed_pool_pages(layout: ChainLayout, shares: Sequence[float]) -> tuple[int, ...]:
    """Whole pages per pool, placed LOW | FLOAT ... FLOAT | HIGH without overlap (each
    float starts on its own grid after the pool below; the last float takes what is left
    before the HIGH pool)."""
    b = layout.buffer_bytes
    bands = layout.bands
    pages = [math.floor(s * b / bl.page_bytes) for s, bl in zip(shares, bands, strict=True)]
    if len(bands) >= 3:
        cursor = pages[0] * bands[0].page_bytes
        high_start = b - pages[-1] * bands[-1].page_bytes
        for j in range(1, len(bands) - 1):
            pw = bands[j].page_bytes
            start = math.ceil(cursor / pw) * pw
            room = max(0, (high_start - start) // pw)
            pages[j] = room if j == len(bands) - 2 else min(pages[j], room)
            cursor = start + pages[j] * pw
    return tuple(pages)


def _equal_page_layout(classes: Sequence[CacheClass], buffer_bytes: int,
                       geo: EqualPageGeometry) -> ChainLayout:
    ordered = _ordered(classes)
    anchors = chain_anchors(len(ordered))
    bands = []
    for c, anchor, pb in zip(ordered, anchors, geo.page_bytes, strict=True):
        grid = buffer_bytes % pb if anchor is Anchor.HIGH else 0
        null = 1 if c.lifetime in (LifetimeClass.WINDOW, LifetimeClass.LOCAL) else 0
        bands.append(BandLayout(c, anchor, geo.page_tokens if c.is_token_class else 1, pb,
                                grid, (buffer_bytes - grid) // pb, null))
    layout = ChainLayout(buffer_bytes, geo.page_tokens, tuple(bands), 1)
    needed = smallest_request_bytes(layout.bands, 1) + layout.reserved_bytes
    if needed > buffer_bytes:
        raise BufferTooSmallError(
            f"equal-page pool of {buffer_bytes:,} B cannot hold one smallest request "
            f"({needed:,} B in blocks of {geo.block_bytes:,} B)",
            needed_bytes=needed, available_bytes=buffer_bytes)
    return layout


def build_manager(kind: ManagerKind, classes: Sequence[CacheClass], buffer_bytes: int,
                  page_size: int = 16) -> ManagerSetup:
    """Build one memory manager for a model's classes in a buffer of ``buffer_bytes``.

    Args:
        kind: which manager.
        classes: the model's lifetime classes.
        buffer_bytes: ``B``, the KV buffer (the same for every manager).
        page_size: ``P`` tokens per page (kvchain, fixed pools; the equal-page pool's
            smallest block).

    Raises:
        LayoutError / BufferTooSmallError: the buffer cannot hold one smallest request
            under this manager's geometry.
        ConfigError: a fixed pool too small for one request.
    """
    if kind is ManagerKind.KVCHAIN:
        layout = plan_layout(classes, buffer_bytes, page_size)
        return ManagerSetup(kind, layout, Chain(layout),
                            f"one chain of bands ({layout.shape_name}), P={page_size}")
    if kind is ManagerKind.FIXED_POOLS:
        layout = plan_layout(classes, buffer_bytes, page_size)
        shares = fixed_pool_shares(classes)
        pages = _fixed_pool_pages(layout, shares)
        alloc = PoolAllocator(layout, CapacityRule.FIXED, pages)
        parts = ", ".join(f"{bl.label} {s:.3f} ({p:,} pages)"
                          for bl, s, p in zip(layout.bands, shares, pages, strict=True))
        return ManagerSetup(kind, layout, alloc, f"fixed pools: {parts}")
    if kind is ManagerKind.EQUAL_PAGE:
        geo = equal_page_geometry(classes, page_size)
        layout = _equal_page_layout(classes, buffer_bytes, geo)
        alloc = PoolAllocator(layout, CapacityRule.SHARED)
        return ManagerSetup(kind, layout, alloc,
                            f"equal-page pool: {buffer_bytes // geo.block_bytes:,} blocks of "
                            f"{geo.block_bytes:,} B, {geo.page_tokens} tokens per block, "
                            f"groups {geo.groups} of {geo.group_size} layers")
    if kind is ManagerKind.IDEAL:
        layout = plan_layout(classes, buffer_bytes, 1, null_pages=False)
        return ManagerSetup(kind, layout, PoolAllocator(layout, CapacityRule.SHARED),
                            "exact bytes: one-token pages, no null pages, one shared pool")
    raise ConfigError(f"unknown manager {kind!r}")  # pragma: no cover
