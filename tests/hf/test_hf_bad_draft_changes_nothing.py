"""A refused draft proposal changes nothing (:class:`kvchain.hf.ChainEngine`).

Before: the proposals of a draft outside the chain were asked for after ``scheduler.step``
had taken the step's pages (the decodes' ``1 + k`` tokens); a proposal of the wrong length
or with an id outside the vocabulary raised there, and the step's pages stayed taken for
tokens nobody computed or committed. Now the engine asks and checks them between
``Scheduler.schedule`` and ``allocate``, and aborts the scheduled step
(``Scheduler.abort``) on a refusal: no page is taken.

The geometry, by hand: gemma-3 (window band, full band), ``P = 4``, ``k = 2``. The prompt
of 3 tokens is prefilled at step 0 (one chunk: 1 page per band) and its first token
sampled; step 1 decodes at context 3 and computes positions 3 .. 5 (``1 + k`` = 3 tokens),
6 tokens in all: 2 pages per band, 1 more than held. Live pages per band (window, full)
count the window band's null page: (1, 0) empty, (2, 1) after step 0. The planted sibling
(the old order: take, then check) leaves the step's 2 pages (1 per band) live: (3, 2).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from kvchain.errors import ConfigError

from .families import build_model

K = 2
PROMPT = [1, 2, 3]


class _Switch:
    """Proposes ``k`` zeros, or while ``bad`` is set a bad proposal: ``k + 1`` tokens
    (``"long"``) or the id ``vocab`` (``"vocab"``)."""

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.bad: str | None = None

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        if self.bad == "long":
            return [0] * (k + 1)
        if self.bad == "vocab":
            return [self.vocab] * k
        return [0] * k


def _engine(cls: type | None = None) -> tuple[object, _Switch]:
    from kvchain.hf import ChainEngine

    model = build_model("gemma-3")
    draft = _Switch(int(model.config.get_text_config(decoder=True).vocab_size))
    engine = (cls or ChainEngine)(model, 9_000, page_size=4, draft=draft, spec_tokens=K)
    engine.add(0, PROMPT, 6)
    return engine, draft


def _live(engine: object) -> tuple[int, ...]:
    """Live pages per band (low -> high)."""
    return tuple(b.live for b in engine.chain.snapshot().bands)  # type: ignore[attr-defined]


def _state(engine: object) -> tuple[object, ...]:
    """What a refused step must leave as it was: live pages per band, the request's tokens
    and page tables, the scheduler's view of it, the proposals recorded."""
    kv, r = engine.kv, engine.scheduler.request(0)  # type: ignore[attr-defined]
    tables = tuple(kv.page_table(0, b).tolist() for b in range(kv.geom.num_bands))
    return (_live(engine), kv.tokens(0), tables, r.computed, r.output_done,
            len(engine.proposals))  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["long", "vocab"])
def test_refused_proposal_takes_no_page_and_the_run_goes_on(bad: str) -> None:
    engine, draft = _engine()
    engine.step()  # step 0: the prompt's one chunk, first token sampled
    before = _state(engine)
    assert before[0] == (2, 1) and before[1] == 3  # null + 1 page, 1 page; 3 tokens
    draft.bad = bad
    with pytest.raises(ConfigError, match="the draft proposed"):
        engine.step()
    assert _state(engine) == before
    engine.kv.audit()
    draft.bad = None  # the same engine runs on and generates what a clean one does
    clean, _ = _engine()
    assert [r.tokens for r in engine.run().values()] == [r.tokens for r in clean.run().values()]
    assert _live(engine) == (1, 0)  # the null page only


def test_planted_take_then_check_leaks_the_step_pages() -> None:
    """Planted defect: the old order (the take, then the proposals checked) leaves the
    decode's new page in each band live after the refusal: (2, 1) -> (3, 2)."""
    from kvchain.hf import ChainEngine

    class _TakeThenCheck(ChainEngine):
        def _allocate(self, now: float):  # type: ignore[no-untyped-def]
            batch = self.scheduler.step(now)
            return batch, self._propose(batch.decodes)

    engine, draft = _engine(_TakeThenCheck)
    engine.step()
    assert _live(engine) == (2, 1)
    draft.bad = "vocab"
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        engine.step()
    assert _live(engine) == (3, 2)
