"""``k`` drafts per decode past the model's context are refused at once (typed, nothing run).

A speculative decode of a request holding ``L >= 1`` tokens of KV computes ``1 + k`` more
(positions ``L .. L + k``): after a one-token prompt ``2 + k`` tokens, so with
``k >= C - 1`` (``C`` the context) no request could ever take a step within its context.
``simulate --spec-tokens 100000`` on Qwen3-8B
(context 40,960) ran anyway: each request held 100,000 draft tokens of KV past the context
(52 GB of "speculative memory" for two requests) and took minutes; ``plan`` printed a
concurrency for it.
"""

from __future__ import annotations

import pytest

from kvchain.catalog.loader import load_model
from kvchain.errors import ConfigError
from kvchain.gpu import get_gpu
from kvchain.sim.engine import SimConfig
from kvchain.sim.traces import Trace

QWEN3_8B_CONTEXT = 40_960  # max_position_embeddings of Qwen3-8B's config


@pytest.mark.parametrize("k", [QWEN3_8B_CONTEXT - 1, QWEN3_8B_CONTEXT, 100_000])
def test_sim_config_refuses_k_at_or_past_the_context(k: int) -> None:
    model = load_model("Qwen3-8B")
    with pytest.raises(ConfigError, match=f"spec_tokens {k:,}.*context of 40,960 tokens"):
        SimConfig(model, get_gpu("h200"), Trace("empty", (), "none", "none"), spec_tokens=k)


def test_sim_config_takes_k_of_the_context_less_two() -> None:
    model = load_model("Qwen3-8B")
    cfg = SimConfig(model, get_gpu("h200"), Trace("empty", (), "none", "none"),
                    spec_tokens=QWEN3_8B_CONTEXT - 2)  # 2 + k = C: fits
    assert cfg.spec_tokens == QWEN3_8B_CONTEXT - 2
