"""A speculative-decoding draft model joined to its target: one spec, the draft's cache
layers as bands of their own (docs/design.md, "Draft model bands").

A separate draft model (or an EAGLE head, or an MTP layer with KV of its own) computes
every token the target computes: it runs over the prompt (its prefill), drafts ``k``
tokens one decode at a time, and keeps the KV of the drafted tokens until the target's
verify commits ``1 + a`` of them and rolls the rest back. Its cache therefore follows the
request's tokens exactly like the target's, so its layers join the target's
:class:`~kvchain.model.spec.ModelSpec` as classes of their own (``owner = "draft"``,
labels ``"draft.full"``, ``"draft.state"``, ``"draft.window"``...), each one band of the
chain, priced with the target's in one budget.
"""

from __future__ import annotations

import dataclasses

from kvchain.errors import ConfigError
from kvchain.model.layers import DRAFT, TARGET, LayerCache
from kvchain.model.spec import DefaultedField, DraftKind, ModelSpec


def with_draft(target: ModelSpec, draft: ModelSpec, kind: DraftKind = DraftKind.MODEL
               ) -> ModelSpec:
    """The target with a speculative-decoding draft joined: one spec whose classes hold
    the target's bands and the draft's own.

    Args:
        target: the served model (no draft of its own yet).
        draft: the draft as a model of its own (its layers, weights and parameters, per
            tensor-parallel rank as its spec says; its cache bytes per token and per slot
            may differ from the target's in every way: the chain's page size is in
            tokens, so a draft band's page is ``P x E_draft`` bytes).
        kind: how it joins (:class:`~kvchain.model.spec.DraftKind`); ``MTP_SHARED``
            adds no layers (its attention reads the target's KV) but keeps the draft's
            cost facts.

    Returns:
        A :class:`ModelSpec` with the target's name, weights, parameters, layer count,
        width, heads and ``tp`` (the target's cost facts), ``layers`` = the target's
        layers followed by the draft's, each re-tagged ``owner = "draft"`` and keeping
        the draft's own 0-based index (none for ``MTP_SHARED``); ``draft`` = the draft's
        own spec (its cost facts: weights, parameters, layers, bytes per token),
        ``draft_kind`` = ``kind``; ``defaulted`` = the target's, then the draft's with
        field names prefixed ``"draft."``. The name is ``"<target>+<draft>"``.

        Context: a draft must compute every token of the request, so the spec's
        ``max_context_tokens`` is **capped** at the shorter of the two (a draft with a
        shorter context than the target's lowers the joined model's: ``plan`` then caps
        the longest request at it and ``simulate`` refuses or truncates requests past
        it); unknown on one side (``None``) takes the other's.

    Raises:
        ConfigError: ``kind`` not a :class:`DraftKind`; the target already has a draft;
            the draft has a draft of its own or layers already tagged for another owner;
            the draft keeps no cache layers but ``kind`` says it owns KV (declare
            ``MTP_SHARED``).
    """
    if not isinstance(kind, DraftKind):
        raise ConfigError(f"draft kind must be a DraftKind "
                          f"({', '.join(k.value for k in DraftKind)}), got {kind!r}")
    if target.draft is not None:
        raise ConfigError(f"{target.name} already has a draft ({target.draft.name})")
    if draft.draft is not None:
        raise ConfigError(f"the draft {draft.name} has a draft of its own "
                          f"({draft.draft.name}); a draft drafts alone")
    foreign = sorted({x.owner for x in draft.layers if x.owner != TARGET})
    if foreign:
        raise ConfigError(f"the draft {draft.name} has layers tagged {foreign}; "
                          f"pass the draft as a model of its own")
    if not draft.layers and not kind.shares_target_kv:
        raise ConfigError(f"the draft {draft.name} keeps no cache layers; a draft that "
                          f"reads the target's KV is declared {DraftKind.MTP_SHARED.value}")
    own: tuple[LayerCache, ...] = () if kind.shares_target_kv else tuple(
        dataclasses.replace(x, owner=DRAFT) for x in draft.layers)
    contexts = [c for c in (target.max_context_tokens, draft.max_context_tokens)
                if c is not None]
    defaulted = target.defaulted + tuple(
        DefaultedField(f"{DRAFT}.{d.field}", d.value, d.by) for d in draft.defaulted)
    return dataclasses.replace(
        target, name=f"{target.name}+{draft.name}", layers=target.layers + own,
        max_context_tokens=min(contexts) if contexts else None, defaulted=defaulted,
        draft=draft, draft_kind=kind)


def check_draft_drafts(draft_model: str | None, spec_tokens: int) -> None:
    """Refuse a draft model named without speculative decoding (``k = 0``): it would draft
    nothing, yet its bands and weights would take memory. One rule for ``plan`` and the
    run options of ``simulate`` / ``compare`` / ``sweep``.

    Args:
        draft_model: the draft's catalog name, or ``None``.
        spec_tokens: ``k``, drafts per decode.

    Raises:
        ConfigError: a draft with ``k = 0``.
    """
    if draft_model is not None and spec_tokens == 0:
        raise ConfigError(f"--draft-model {draft_model} drafts nothing without "
                          f"--spec-tokens > 0")


def check_spec_tokens(spec_tokens: int, model: ModelSpec) -> None:
    """Refuse ``k`` drafts per decode that no request of ``model`` could ever draft.

    A speculative decode of a request holding ``L`` tokens of KV computes ``1 + k`` more
    (positions ``L .. L + k``); after the shortest prompt (one token, ``L = 1``) that is
    ``2 + k`` tokens, so with ``2 + k`` past the model's context ``C`` (tokens,
    ``model.max_context_tokens``; with a draft joined, the shorter of the two), i.e.
    ``k >= C - 1``, no request could take a single speculative step within its context.
    Unknown context: nothing is checked.

    Args:
        spec_tokens: ``k``, drafts per decode (an int >= 0, checked by the caller).
        model: the served model (its context in tokens).

    Raises:
        ConfigError: ``k >= C - 1``.
    """
    context = model.max_context_tokens
    if context is not None and spec_tokens + 2 > context:
        raise ConfigError(f"spec_tokens {spec_tokens:,} (--spec-tokens): a decode after a "
                          f"one-token prompt holds 2 + k = {spec_tokens + 2:,} tokens, past "
                          f"{model.name}'s context of {context:,} tokens; k must be at most "
                          f"the context - 2 = {context - 2:,}")
