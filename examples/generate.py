"""A tiny hybrid model generating a batch of prompts with its caches in a kvchain chain.

The model is transformers' LaraMini (Gated DeltaNet + sliding-window + full attention, the
three-band pattern state | window FLOAT | full), scaled down to random fp32 weights. Five
prompts arrive over the first steps; the engine prefills them in chunks, decodes them
together and releases their pages, while the chain compacts and relocates the window float
under them. Prints the bands before, at the busiest step and after, the moves made, and
each request's greedy tokens (how many distinct: the weights are drawn wide enough that the
output is not one repeated token) and whether they equal ``model.generate`` with
transformers' own cache.

Run: ``python examples/generate.py`` after ``pip install -e ".[torch,hf]"`` (torch and
transformers; install ``torch==2.13.0`` first for the CPU build). Without them it says so and
exits with status 2.
"""

from __future__ import annotations

import sys

try:
    import torch
    from transformers import AutoModelForCausalLM, LaraMiniConfig
except ImportError as exc:  # pragma: no cover - the message of a missing extra
    print(f"examples/generate.py needs torch and transformers ({exc}); install them with "
          "pip install torch==2.13.0 && pip install -e \".[torch,hf]\"", file=sys.stderr)
    sys.exit(2)

from kvchain.alloc.chain import Chain
from kvchain.hf import ChainEngine

PROMPTS = ((0, 13, 6, 0), (1, 5, 9, 0), (2, 21, 5, 2), (3, 9, 7, 3), (4, 17, 4, 5))


def band_table(chain: Chain) -> str:
    """The chain's bands now: byte range, live pages, holes (plain text)."""
    lines = [f"  {'band':<7}{'anchor':<7}{'bytes [lo, hi)':>20}{'live':>6}{'holes':>7}"]
    for i, bl in enumerate(chain.layout.bands):
        b = chain.band(i)
        lines.append(f"  {bl.label:<7}{bl.anchor.value:<7}{f'[{b.lo:,}, {b.hi:,})':>20}"
                     f"{b.live:>6}{b.holes:>7}")
    return "\n".join(lines)


INIT_STD = 0.2
"""Standard deviation of the random weights (``initializer_range``). At transformers'
default 0.02 a model this small is nearly constant: every request greedily repeats one
token ([76, 76, 76, ...]), so equal outputs would prove little. At 0.2 the greedy tokens
vary (4 to 7 distinct of 4 to 9 generated), so equality is checked token by token on a
real sequence."""


def build_model() -> torch.nn.Module:
    """LaraMini at hidden 32: layer 0 Gated DeltaNet, 1 sliding window (W = 8), 2 full;
    random fp32 weights drawn with seed 0 and standard deviation :data:`INIT_STD`."""
    torch.manual_seed(0)
    config = LaraMiniConfig(
        vocab_size=96, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, intermediate_size=32, num_hidden_layers=3, sliding_window=8,
        layer_types=["linear_attention", "sliding_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        pad_token_id=None, eos_token_id=None, bos_token_id=None, initializer_range=INIT_STD)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def main() -> int:
    """Generate, print, and return 0 when the tokens equal transformers' generation."""
    model = build_model()
    engine = ChainEngine(model, 13_000, page_size=4, chunk_size=8, flush_every=3)
    g = torch.Generator().manual_seed(1)
    prompts = {}
    for rid, n, new, arrival in PROMPTS:
        prompts[rid] = torch.randint(0, 96, (n,), generator=g).tolist()
        engine.add(rid, prompts[rid], new, arrival)
    print(f"chain {engine.layout.shape_name} in {engine.layout.buffer_bytes:,} B, "
          f"{engine.layout.page_size} tokens/page")
    print("before:\n" + band_table(engine.chain))
    busiest, table = -1, ""
    while not engine.idle:
        engine.step()
        live = sum(engine.chain.band(i).live for i in range(engine.chain.num_bands))
        if live > busiest:
            busiest, table = live, band_table(engine.chain)
    print(f"busiest step ({busiest} pages live):\n{table}")
    print("after:\n" + band_table(engine.chain))
    s = engine.chain.stats
    print(f"moves: {s.compactions} compactions, {s.relocations} relocations, "
          f"{s.pages_copied} pages ({s.bytes_copied:,} B) copied; {engine.forwards} forwards "
          f"in {engine.step_count} steps")
    same = True
    for rid, n, new, _ in PROMPTS:
        ids = torch.tensor([prompts[rid]])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False)[0, n:].tolist()
        mine = engine.results[rid].tokens
        same &= mine == ref
        print(f"request {rid}: prompt {n:>2} tokens -> {mine} "
              f"({len(set(mine))} distinct; {'=' if mine == ref else '!='} model.generate)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
