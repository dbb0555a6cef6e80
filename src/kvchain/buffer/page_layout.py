"""Where each layer's tensors lie inside a page, and the strided views over a band.

Layout within one page: the band's layers in model order (``band.cache_class.layers``),
each layer's tensors in declaration order, each tensor a contiguous
``page_tokens x prod(shape)`` block of its dtype. Token band with ``P`` tokens per page and
two layers of different head dims (MiMo-like: K 192, V 128)::

    physical page j of the band (page_bytes = P * E)
    |<------------------------------------- page_bytes ------------------------------------->|
    | L0.k [P, h0, 192] | L0.v [P, h0, 128] | L1.k [P, h1, 192] | L1.v [P, h1, 128] |
    ^ grid_base + j * page_bytes

    view of L0.v over the band: shape [num_pages, P, h0, 128], dtype bf16,
        element (j, t, h, d) at byte grid_base + j * page_bytes + offset(L0.v)
                                 + ((t * h0 + h) * 128 + d) * 2

This is the ``[pages, page_size, kv_heads, head_dim]`` layout that paged-attention kernels
(FlashInfer's paged KV cache, FlashAttention's ``block_table`` path) read in place: a page
table of physical indices plus one such view per layer and tensor. A state band has one
request's slot per page (``page_tokens = 1``): its views are ``[num_slots, *shape]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvchain.errors import BufferArgumentError, BufferUnsupportedError
from kvchain.layout import BandLayout
from kvchain.model.layers import CacheDtype, LayerCache


@dataclass(frozen=True, slots=True)
class TensorPlacement:
    """One tensor of one layer inside a page.

    Attributes:
        name: the tensor's name (``"k"``, ``"v"``, ``"latent"``, ``"conv"``, ``"ssm"``...).
        offset: bytes from the start of the page.
        page_shape: the tensor's shape within one page: ``(page_tokens, *shape)`` in a token
            band, ``shape`` in a state band.
        dtype: element type.
        nbytes: bytes of the tensor within one page.
    """

    name: str
    offset: int
    page_shape: tuple[int, ...]
    dtype: CacheDtype
    nbytes: int


@dataclass(frozen=True, slots=True)
class ViewGeometry:
    """Shape and strides (in elements) of one tensor's view over a band.

    Attributes:
        name: tensor name.
        dtype: element type.
        base_byte: byte offset of element ``(0, ...)`` in the buffer.
        shape: ``(num_pages, *page_shape)``.
        strides: element strides (dimension 0 steps one page).
    """

    name: str
    dtype: CacheDtype
    base_byte: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def layer_placements(band: BandLayout, layer: LayerCache) -> tuple[TensorPlacement, ...]:
    """Placements of ``layer``'s tensors inside a page of ``band``.

    Raises:
        BufferArgumentError: the layer is not one of the band's layers, or the band's
            ``page_bytes`` differs from ``page_tokens x`` the bytes of its layers (a band
            not built by :func:`~kvchain.layout.plan_layout`).
    """
    layers = band.cache_class.layers
    if layer not in layers:
        raise BufferArgumentError(
            f"layer {layer.index} ({layer.kind}) is not in the {band.label} band "
            f"(its layers: {[x.index for x in layers]})")
    token_band = band.cache_class.is_token_class
    offset = 0
    found: tuple[TensorPlacement, ...] = ()
    for member in layers:
        placed = []
        for tensor in member.tensors:
            shape = (band.page_tokens, *tensor.shape) if token_band else tensor.shape
            nbytes = math.prod(shape) * tensor.dtype.nbytes
            placed.append(TensorPlacement(tensor.name, offset, shape, tensor.dtype, nbytes))
            offset += nbytes
        if member == layer:
            found = tuple(placed)
    if offset != band.page_bytes:
        raise BufferArgumentError(
            f"{band.label} band pages hold {band.page_bytes:,} B but its layers' tensors "
            f"take {offset:,} B per page")
    return found


def view_geometry(band: BandLayout, placement: TensorPlacement, num_pages: int
                  ) -> ViewGeometry:
    """The strided view of one tensor over all ``num_pages`` pages of the band's grid.

    Raises:
        BufferUnsupportedError: the tensor's first byte or the page size is not a multiple
            of its element size (a typed view needs aligned elements).
    """
    item = placement.dtype.nbytes
    base = band.grid_base + placement.offset
    if base % item or band.page_bytes % item:
        raise BufferUnsupportedError(
            f"tensor {placement.name!r} of the {band.label} band starts at byte {base:,} "
            f"with pages of {band.page_bytes:,} B: not aligned to its {item}-byte elements")
    inner = []
    step = 1
    for extent in reversed(placement.page_shape):
        inner.append(step)
        step *= extent
    strides = (band.page_bytes // item, *reversed(inner))
    return ViewGeometry(placement.name, placement.dtype, base,
                        (num_pages, *placement.page_shape), strides)
