"""Per-position state checkpoints for ``StateRollback.CHECKPOINTS`` on transformers models.

A speculative verify computes ``T = 1 + k`` tokens per request. ``CHECKPOINTS`` rollback
needs the recurrent state after *each* of them, so that the state after the last accepted
token can become the working state with nothing recomputed. transformers' recurrent mixers
(Qwen3-Next / LaraMini Gated DeltaNet, Nemotron-H Mamba-2) return only the state after the
last position of a multi-token call (their chunked kernels keep no intermediate state;
``LinearAttentionLayer.activate_past_recording`` keeps past *conv* columns only, and
``is_croppable`` is False as soon as a recurrent state exists).

So during the verify forward, and only there, each recurrent mixer is called once per
position: a ``[B, T, hidden]`` call becomes ``T`` calls of ``[B, 1, hidden]`` (the model's
own single-token decode path, the one greedy ``generate`` runs), and after position ``j``
the state layer writes its conv and recurrent state into the rows' checkpoint slot ``j``
(:meth:`kvchain.hf.cache.SlotStateLayer.save`). The attention, MLP and MoE layers still
run once over all ``T`` tokens. This is exact for a causal mixer: its output at position
``j`` depends only on the state before the step and inputs ``0 .. j``.

Cost (per state layer and verify): ``T`` single-token mixer calls instead of one chunked
call (the mixer's weights are read ``T`` times; ``T`` kernel launches on a GPU), and
``T x slot_bytes / num_state_layers`` bytes of state written (one checkpoint per position)
where the plain forward writes one. A kernel that emits intermediate states (vLLM's
speculative Mamba / GDN path writes one state per draft position) would do the same in one
call; transformers has none.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from kvchain.errors import ConfigError
from kvchain.hf.cache import ChainCache, SlotStateLayer
from kvchain.hf.context import current_batch

_CACHE_ARGS = ("cache", "cache_params")


def _takes_cache(module: Any) -> bool:
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False
    return any(name in params for name in _CACHE_ARGS)


def recurrent_mixers(model: Any, layers: Iterable[int]) -> dict[int, Any]:
    """The module that runs each recurrent layer's state update, per layer index.

    For layer ``i`` it is the innermost submodule of ``model`` with ``layer_idx == i``
    whose ``forward`` takes the cache (``cache`` / ``cache_params``): Qwen3-Next and
    LaraMini ``*GatedDeltaNet`` (``layers[i].linear_attn``), Nemotron-H
    ``NemotronHMamba2Mixer`` (``layers[i].mixer``, inside the block that also has
    ``layer_idx``).

    Args:
        model: a transformers causal LM.
        layers: model layer indices of its recurrent (state) layers.

    Returns:
        layer index -> the mixer module.

    Raises:
        ConfigError: a layer with no such module, or with two that are not nested.
    """
    wanted = set(layers)
    found: dict[int, list[tuple[str, Any]]] = {i: [] for i in wanted}
    for name, module in model.named_modules():
        idx = getattr(module, "layer_idx", None)
        if isinstance(idx, int) and idx in wanted and _takes_cache(module):
            found[idx].append((name, module))
    out: dict[int, Any] = {}
    for idx in sorted(wanted):
        names = [n for n, _ in found[idx]]
        inner = [(n, m) for n, m in found[idx]
                 if not any(o != n and o.startswith(n + ".") for o in names)]
        if len(inner) != 1:
            raise ConfigError(f"state layer {idx}: found {len(inner)} recurrent mixers "
                              f"({[n for n, _ in inner]}); CHECKPOINTS rollback needs exactly "
                              f"one module with layer_idx {idx} whose forward takes the cache")
        out[idx] = inner[0][1]
    return out


def _split_forward(original: Any, layer: SlotStateLayer, name: str) -> Any:
    """A mixer forward that runs a ``[B, T, hidden]`` call as ``T`` single-token calls and
    saves the state after each position into checkpoint slot ``j``."""

    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        batch = current_batch()
        if "hidden_states" in kwargs:
            hidden = kwargs.pop("hidden_states")
        else:
            hidden, *rest = args
            args = tuple(rest)
        mask = kwargs.get("attention_mask")
        if mask is not None and (not isinstance(mask, torch.Tensor) or mask.ndim != 2):
            raise ValueError("a per-position state split takes only a 2-D padding mask")
        outs = []
        for j in range(int(hidden.shape[1])):
            kw = dict(kwargs)
            if mask is not None:
                kw["attention_mask"] = mask[:, j:j + 1]
            out = original(hidden[:, j:j + 1], *args, **kw)
            if not isinstance(out, torch.Tensor):
                raise ConfigError(f"recurrent mixer {name} returned "
                                  f"{type(out).__name__}, not a tensor")
            layer.save(batch, j)
            outs.append(out)
        return torch.cat(outs, dim=1)

    return forward


@contextlib.contextmanager
def per_position_state(mixers: dict[int, Any], cache: ChainCache) -> Iterator[None]:
    """While the block runs, every mixer of ``mixers`` (from :func:`recurrent_mixers`)
    computes one position at a time and its state layer in ``cache`` saves the state
    after each position (module docstring). The mixers' own ``forward`` is restored on
    exit (an instance attribute is set and removed; the model is otherwise untouched).

    Raises:
        ConfigError: a mixer whose cache layer is not a state layer of ``cache``.
    """
    installed = []
    try:
        for idx, module in mixers.items():
            layer = cache.layers[idx]
            if not isinstance(layer, SlotStateLayer):
                raise ConfigError(f"layer {idx} has no state slot in the chain cache")
            module.forward = _split_forward(module.forward, layer, type(module).__name__)
            installed.append(module)
        yield
    finally:
        for module in installed:
            del module.forward
