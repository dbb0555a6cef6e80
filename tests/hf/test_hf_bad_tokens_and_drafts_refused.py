"""Bad input to :class:`kvchain.hf.ChainEngine` is refused typed, where it is given.

* A prompt of token ids outside the target's vocabulary (negative, or ``>= vocab_size``)
  was queued by ``add`` and failed later inside the embedding of a step (``IndexError``
  from torch, after the scheduler had admitted and allocated the request).
* A draft that is a bare transformers model (neither a :class:`~kvchain.hf.ChainDraft` nor
  an object with ``propose``, e.g. the draft model passed without its wrapper) was taken
  and failed at the first speculative step with an ``AttributeError``.
* A draft proposing a token id outside the vocabulary failed inside the verify's embedding
  (``IndexError``); it is refused as the proposals are read, like a wrong count.
* A request longer than the model's context (``max_position_embeddings``) was run past its
  positions: the engine gave its scheduler no context length. It is rejected, as the
  simulator's scheduler rejects it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvchain.errors import ConfigError, InvalidRequestError

from .families import build_model

K = 2


class _OutOfVocab:
    """Proposes ``vocab_size`` (one past the last id) ``k`` times."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        return [self.vocab] * k


def _vocab(model: object) -> int:
    return int(model.config.get_text_config(decoder=True).vocab_size)  # type: ignore[attr-defined]


def test_prompt_outside_the_vocabulary_refused_by_add() -> None:
    from kvchain.hf import ChainEngine

    model = build_model("gemma-3")
    engine = ChainEngine(model, 9_000)
    vocab = _vocab(model)
    for bad in ([1, -1, 2], [1, vocab], [True, 2], [1.5, 2]):
        with pytest.raises(InvalidRequestError, match="token id"):
            engine.add(0, bad, 4)
    assert engine.results == {} and engine.idle  # nothing queued
    engine.add(0, [1, vocab - 1], 2)  # the last id is in the vocabulary
    assert len(engine.run()[0].tokens) == 2  # the 2 generated tokens


def test_bare_model_as_draft_refused_at_construction() -> None:
    from kvchain.hf import ChainEngine

    model = build_model("gemma-3")
    with pytest.raises(ConfigError, match="propose"):
        ChainEngine(model, 9_000, draft=build_model("gemma-3"), spec_tokens=K)


def test_draft_token_outside_the_vocabulary_refused() -> None:
    from kvchain.hf import ChainEngine

    model = build_model("gemma-3")
    engine = ChainEngine(model, 9_000, draft=_OutOfVocab(_vocab(model)), spec_tokens=K)
    engine.add(0, [1, 2, 3], 4)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        engine.run()


def test_request_past_the_context_rejected_not_run() -> None:
    from kvchain.hf import ChainEngine

    model = build_model("gemma-3")  # max_position_embeddings = 256 (families.COMMON)
    engine = ChainEngine(model, 200_000)
    engine.add(0, [1] * 250, 7)  # 250 + 7 = 257 > 256: rejected
    engine.add(1, [1] * 250, 6)  # 250 + 6 = 256: exactly the context, runs
    results = engine.run()
    assert results[0].rejected is not None and results[0].rejected.startswith("context:")
    assert results[0].tokens == []  # nothing generated
    assert results[1].rejected is None and len(results[1].tokens) == 6
