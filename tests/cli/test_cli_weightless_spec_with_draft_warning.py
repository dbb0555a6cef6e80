"""A weightless spec file joined with a bundled draft: the buffer warning must not say the
KV buffer takes the whole GPU. The buffer from --mem-fraction is the GPU less the resident
weights, and with ``--draft-model Qwen3-0.6B`` those are the draft's 1,191,968,768 B
(595,984,384 bf16 parameters), so ``plan`` reported a buffer 1,191,968,768 B smaller than
the target alone's while the warning said "takes the whole GPU"."""

from __future__ import annotations

from pathlib import Path

from kvchain.catalog.loader import load_model
from kvchain.cli.common import buffer_warnings
from kvchain.gpu import get_gpu
from kvchain.model import declare_model, with_draft

QWEN3_06B_WEIGHTS = 1_191_968_768


def test_weightless_target_with_a_draft_names_the_drafts_weights() -> None:
    joined = with_draft(declare_model("mine", full=32_000), load_model("Qwen3-0.6B"))
    (line,) = buffer_warnings(joined, get_gpu("h200"), None, spec_file=Path("mine.json"),
                              reads_weights=False)
    assert not line.endswith("takes the whole GPU")
    assert (f"the KV buffer from --mem-fraction takes the whole GPU but the draft "
            f"Qwen3-0.6B's {QWEN3_06B_WEIGHTS:,} B of weights") in line


def test_weightless_target_alone_keeps_the_whole_gpu_words() -> None:
    (line,) = buffer_warnings(declare_model("mine", full=32_000), get_gpu("h200"), None,
                              spec_file=Path("mine.json"), reads_weights=False)
    assert line.endswith("the KV buffer from --mem-fraction takes the whole GPU")
