"""A draft model's KV and state in the chain's draft bands (issue 24 item 2 on real models).

:class:`kvchain.hf.ChainDraft` joins the draft's cache layers to the target's chain as
bands of their own (``kvchain.model.with_draft``: ``draft.full``, ``draft.window``,
``draft.state``), priced with the target's in one buffer. The engine prefills every prompt
chunk through the draft into its pages, has it propose ``k = 3`` tokens by ``1 + k``
one-token decodes over its pages, and rolls it back with the target: ``KVManager.verify``
truncates its pages as the target's, its state follows the engine's rollback mode.

Oracles, per family (the workload of ``test_hf_speculative``, a flush after every step):

* the tokens equal greedy ``generate`` of the target (transformers' own cache);
* the draft's proposals, request by request, equal those of the same draft model run as a
  :class:`~kvchain.hf.ModelDraft` (``generate`` with transformers' own cache over the
  whole sequence each step): the draft's pages and state hold what its own cache would;
* the settled audit after every step (no rolled-back page kept in any band, draft bands
  included) and every page released at the end.

Buffers (bytes, found by a sweep: the draft roughly doubles each request's pages; two
state bands of ``1 + k`` or 2 slots of 2,048 B in Qwen3-Next): the planner relocates a
float (a draft band among them) in every case.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="kvchain.hf needs torch")
pytest.importorskip("transformers", reason="kvchain.hf needs transformers")

from kvchain.bands.geometry import StateRollback  # noqa: E402
from kvchain.errors import AuditError, ConfigError  # noqa: E402
from kvchain.requests.table import RequestTable  # noqa: E402

from .families import build_model, family_config  # noqa: E402
from .test_hf_equality import (  # noqa: E402
    DEVICES,
    LOGIT_TOL,
    PAGE,
    WORKLOAD,
    _prompts,
    _reference,
    _worst_logit_gap,
)
from .test_hf_speculative import NOISE, K, _draft  # noqa: E402

R, C = StateRollback.REPLAY, StateRollback.CHECKPOINTS
# (family, rollback, buffer bytes, weight spread): window + full (gpt-oss, Gemma 3),
# state + full (Qwen3-Next both modes, Nemotron-H), state + window + full (LaraMini). The
# state families at spread 0.2 as in test_hf_speculative's CHECKPOINTS runs.
CASES = [("gemma-3", R, 18_000, None), ("gpt-oss", R, 16_000, None),
         ("qwen3-next", R, 44_000, 0.2), ("qwen3-next", C, 44_000, 0.2),
         ("nemotron-h", C, 44_000, 0.2), ("lara-mini", C, 50_000, 0.2)]
IDS = [f"{f}-{r.value}" for f, r, _, _ in CASES]


def _engine(model: Any, family: str, draft: Any, rollback: StateRollback, buffer: int,
            **kw: Any) -> Any:
    from kvchain.hf import ChainEngine

    return ChainEngine(model, buffer, page_size=PAGE, chunk_size=8, flush_every=1,
                       draft=draft, spec_tokens=K, rollback=rollback, **kw)


def _run(engine: Any, prompts: dict[int, list[int]]) -> tuple[Any, int]:
    """Run the workload; returns the engine and its steps with decodes."""
    for rid, _, new, arrival in WORKLOAD:
        engine.add(rid, prompts[rid], new, arrival)
    decode_steps = 0
    while not engine.idle and engine.step_count < 200:
        decode_steps += bool(engine.step().decodes)
    return engine, decode_steps


def _by_request(proposals: list[tuple[int, list[int]]]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = defaultdict(list)
    for rid, drafts in proposals:
        out[rid].append(drafts)
    return dict(out)


def _draft_bands(engine: Any) -> list[int]:
    return [b for b, band in enumerate(engine.layout.bands)
            if band.cache_class.owner != "target"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("family", "rollback", "buffer", "std"), CASES, ids=IDS)
def test_draft_in_the_chain_equals_transformers(family: str, rollback: StateRollback,
                                                buffer: int, std: float | None,
                                                device: str) -> None:
    from kvchain.hf import ChainDraft, ModelDraft

    model = build_model(family, device, init_std=std)
    draft_model = _draft(model, NOISE[family]).model
    prompts = _prompts()
    engine, decode_steps = _run(_engine(model, family, ChainDraft(draft_model), rollback,
                                        buffer, audit=True), prompts)
    own, _ = _run(_engine(model, family, ModelDraft(draft_model), rollback, buffer),
                  prompts)
    ref = _reference(model, prompts)
    for rid, _, new, _ in WORKLOAD:
        assert engine.results[rid].tokens == ref[rid][0], f"request {rid}"
        assert len(engine.results[rid].tokens) == new
    assert _worst_logit_gap(engine, ref) <= LOGIT_TOL
    # the draft over its pages proposes what it proposes with its own cache
    assert _by_request(engine.proposals) == _by_request(own.proposals)
    spec = engine.spec
    assert 0 < spec.accepted < spec.drafted and spec.rejected > 0
    labels = [b.cache_class.label for b in engine.layout.bands]
    assert "draft.full" in labels
    assert ("draft.window" in labels) == (family in ("gemma-3", "gpt-oss", "lara-mini"))
    assert ("draft.state" in labels) == (family in ("qwen3-next", "nemotron-h",
                                                     "lara-mini"))
    token_draft_bands = [b for b in _draft_bands(engine)
                         if engine.layout.bands[b].cache_class.label != "draft.state"]
    for b in token_draft_bands:  # the verify released rejected drafts' pages there too
        assert engine.kv.speculation.rolled_back_pages[b] > 0
    # each target forward has its draft forward (prefill chunk, replay), except the
    # verify, for which the draft ran 1 + k one-token decodes: k more per decode step
    assert engine.draft_forwards == engine.forwards + K * decode_steps
    stats = engine.chain.stats
    assert stats.pages_copied > 0 and stats.relocations > 0  # pages moved under both
    assert engine.scheduler.counters.finished == len(WORKLOAD)
    assert engine.kv.num_requests == 0
    for band in range(engine.chain.num_bands):  # draft bands too: nothing leaked
        assert engine.chain.bound_pages(band) == engine.layout.bands[band].reserved_pages


def test_planted_draft_pages_kept_after_rollback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback that truncates the target's bands but keeps the rejected drafts' pages
    in the draft's bands is caught by the settled audit after the first rejection."""
    from kvchain.hf import ChainDraft

    model = build_model("gemma-3")
    engine = _engine(model, "gemma-3", ChainDraft(_draft(model).model), R, 18_000,
                     audit=True)
    draft_bands = set(_draft_bands(engine))
    original = RequestTable.truncate

    def keep_draft_pages(self: RequestTable, band: int, slots: Any, keep_end: Any) -> Any:
        if band in draft_bands:
            return np.zeros(0, dtype=np.int64)
        return original(self, band, slots, keep_end)

    monkeypatch.setattr(RequestTable, "truncate", keep_draft_pages)
    with pytest.raises(AuditError, match="rolled-back page kept"):
        _run(engine, _prompts())


def test_planted_draft_state_not_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``REPLAY`` rollback that restores and replays the target's state but leaves the
    draft's at the state after all ``1 + k`` positions changes the draft's proposals
    (the target's tokens cannot show it: speculation never changes them)."""
    from kvchain.hf import ChainDraft, ChainEngine, ModelDraft

    model = build_model("qwen3-next", init_std=0.2)
    draft_model = _draft(model).model
    prompts = _prompts()
    own, _ = _run(_engine(model, "qwen3-next", ModelDraft(draft_model), R, 44_000),
                  prompts)
    monkeypatch.setattr(ChainEngine, "_restore_state",
                        lambda self, rids: self.target.copy_state(rids, 1, 0))
    engine, _ = _run(_engine(model, "qwen3-next", ChainDraft(draft_model), R, 44_000),
                     prompts)
    assert engine.spec.replays > 0
    assert _by_request(engine.proposals) != _by_request(own.proposals)
    ref = _reference(model, prompts)
    assert all(engine.results[rid].tokens == ref[rid][0] for rid in ref)


def test_planted_draft_reads_the_state_before_the_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``CHECKPOINTS`` draft whose every decode reads the state from before the step
    (ring slot ``w``, not the slot its previous decode saved into) changes the draft's
    proposals; the target's tokens stay equal."""
    from kvchain.hf import ChainDraft, ChainEngine, ModelDraft

    model = build_model("qwen3-next", init_std=0.2)
    draft_model = _draft(model).model
    prompts = _prompts()
    own, _ = _run(_engine(model, "qwen3-next", ModelDraft(draft_model), C, 44_000),
                  prompts)
    monkeypatch.setattr(ChainEngine, "_draft_read_slot",
                        staticmethod(lambda work, j, ring: work % ring))
    engine, _ = _run(_engine(model, "qwen3-next", ChainDraft(draft_model), C, 44_000),
                     prompts)
    assert _by_request(engine.proposals) != _by_request(own.proposals)
    ref = _reference(model, prompts)
    assert all(engine.results[rid].tokens == ref[rid][0] for rid in ref)


def test_draft_bands_are_priced_in_the_one_buffer() -> None:
    """The draft's pages are priced with the target's in one buffer. gemma-3, 12,000 B:
    request 2 (19 prompt tokens, 4 new, k = 3) holds at its peak, per model, full pages
    for 19 + 4 - 1 + 3 = 25 tokens, ceil(25 / 4) = 7, and window pages
    max(ceil(8 / 4) + ceil(7 / 4), ceil((8 + 3 - 1) / 4) + 1) = 4 (chunk of 8, W = 8),
    all of 512 B: (7 + 4) x 512 = 5,632 B for the target alone (a draft outside the
    chain: admitted), 11,264 B with the draft's bands, more than the chain's free bytes:
    rejected with that figure, the other three run."""
    from kvchain.hf import ChainDraft, ModelDraft

    model = build_model("gemma-3")
    draft_model = _draft(model).model
    outside, _ = _run(_engine(model, "gemma-3", ModelDraft(draft_model), R, 12_000),
                      _prompts())
    assert all(r.rejected is None for r in outside.results.values())
    engine, _ = _run(_engine(model, "gemma-3", ChainDraft(draft_model), R, 12_000),
                     _prompts())
    why = engine.results[2].rejected
    assert why is not None and "needs 11,264 B of pages at its peak" in why
    assert all(engine.results[rid].rejected is None for rid in (0, 1, 3))
    assert engine.scheduler.counters.finished == 3


def test_chain_draft_refused() -> None:
    import transformers as tf

    from kvchain.hf import ChainDraft, ChainEngine

    with pytest.raises(ConfigError, match="needs a transformers model"):
        ChainDraft(object())
    model = build_model("gemma-3")
    config = family_config("gemma-3")
    config.vocab_size = 128
    other = tf.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(ConfigError, match=r"vocabulary \(128 tokens\) differs"):
        ChainEngine(model, 18_000, draft=ChainDraft(other), spec_tokens=K)
