"""``kvchain plan``: capacity of one model's chain on one GPU, beside fixed pools.

The numbers come from :func:`kvchain.capacity.plan_capacity`; this module parses options
and prints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvchain.bands.geometry import StateRollback
from kvchain.cache.host_tier import (
    HostTierPlan,
    hit_load_bytes,
    host_tier_plan,
)
from kvchain.capacity import (
    Capacity,
    CapacityPlan,
    LongestRequest,
    SpeculativeCapacity,
    longest_request,
    most_state_slots,
    plan_capacity,
    speculative_capacity,
)
from kvchain.catalog.loader import load_draft
from kvchain.cli import app
from kvchain.cli.common import (
    check_draft_vocabulary,
    fail,
    load_spec,
    note,
    note_defaults,
    out_console,
    warn,
    warn_buffer,
)
from kvchain.cli.run_options import (
    DEFAULT_MODEL,
    SPEC_HELP,
    mem_fraction_unused,
    option_typed,
    speculative_warnings,
)
from kvchain.errors import ConfigError, KVChainError
from kvchain.gpu import DEFAULT_MEM_FRACTION, get_gpu, local_host_memory_bytes
from kvchain.layout import ChainLayout
from kvchain.model.draft import check_spec_tokens
from kvchain.model.layers import CacheDtype, LifetimeClass
from kvchain.model.params import WeightFormat
from kvchain.model.spec import ModelSpec
from kvchain.pool_split import MAMBA_FULL_MEMORY_RATIO, SWA_FULL_TOKENS_RATIO
from kvchain.report.tables import band_table
from kvchain.sim.cost import (
    DEFAULT_HOST_LINK_EFFICIENCY,
    GPUCostModel,
    HostHitTiming,
    LoadOverlap,
    host_hit_ttft,
)
from kvchain.sim.run_options import check_values, option_help
from kvchain.sim.traces import MOONCAKE_BLOCK_TOKENS

__all__ = ["longest_request", "plan_command"]

GPU_HELP = ("a100, h100, h200, b200 (memory as the device reports it: nvidia-smi "
            "memory.total, e.g. h100 81,559 MiB), or local: this machine's CUDA GPU 0 "
            "(torch.cuda.mem_get_info total; exit 2 where torch sees none).")
MEM_FRACTION_HELP = ("Fraction of GPU memory for weights + KV + the engine's reserve "
                     "(vLLM's gpu_memory_utilization): KV buffer = floor(memory x fraction) "
                     "- one rank's weights - 3 GiB engine reserve (profiled activations, CUDA "
                     "context, NCCL: vLLM's Llama-3-8B profile); CUDA graphs live in the "
                     "remaining 1 - fraction, as in vLLM.")
HOST_BYTES_HELP = ("Bytes of a host-memory tier for evicted prefixes: report how many tokens "
                   "of resumable prefix it holds (full pages, window tails and a state "
                   "checkpoint per resume point, split between the classes so that all run "
                   "out together). `simulate --host-bytes` runs one.")
HOST_FRACTION_HELP = ("The host tier as a fraction of this machine's physical memory "
                      "(instead of --host-bytes).")
HOST_INTERVAL_HELP = ("Tokens between a cached prefix's resume points in the host tier "
                      "(rounded up to whole pages; 512: the Mooncake traces' content "
                      "blocks). On a state hybrid each resume point costs a state "
                      "checkpoint. simulate takes no such option: it splits by the "
                      "trace's own spacing (its content block times the mean spacing of "
                      "the resume points its prompts keep), so plan with the block size "
                      "of the trace you will run.")


@app.command("plan", short_help="Bands and capacity of one model's chain.")
def plan_command(
    model: Annotated[str, typer.Option(help="Bundled model name.")] = DEFAULT_MODEL,
    config: Annotated[Path | None, typer.Option(help="A Hugging Face config.json.")] = None,
    spec: Annotated[Path | None, typer.Option(help=SPEC_HELP)] = None,
    gpu: Annotated[str, typer.Option(help=GPU_HELP)] = "h200",
    mem_fraction: Annotated[float, typer.Option(help=MEM_FRACTION_HELP)] = DEFAULT_MEM_FRACTION,
    buffer_bytes: Annotated[int | None, typer.Option(help="KV buffer bytes of one rank "
                                                          "(instead of the GPU memory "
                                                          "model).")] = None,
    kv_dtype: Annotated[CacheDtype | None, typer.Option(help=option_help("kv_dtype"))] = None,
    state_dtype: Annotated[CacheDtype | None, typer.Option(help=option_help("state_dtype"))] = None,
    weight_format: Annotated[WeightFormat | None,
                             typer.Option(help=option_help("weight_format"))] = None,
    page_size: Annotated[int, typer.Option(help="Tokens per page.")] = 16,
    tp: Annotated[int, typer.Option(help="Tensor-parallel size: weights and KV bytes are "
                                         "split over the ranks, and every figure printed "
                                         "is one rank's.")] = 1,
    prompt: Annotated[int, typer.Option(help="Prompt tokens of the request mix.")] = 2048,
    output: Annotated[int, typer.Option(help="Output tokens of the request mix.")] = 512,
    slots_held: Annotated[int | None, typer.Option(help="State slots held for the token "
                                                        "capacity (default: the concurrency).")]
    = None,
    host_bytes: Annotated[int | None, typer.Option(help=HOST_BYTES_HELP)] = None,
    host_fraction: Annotated[float | None, typer.Option(help=HOST_FRACTION_HELP)] = None,
    host_interval: Annotated[int, typer.Option(help=HOST_INTERVAL_HELP)]
    = MOONCAKE_BLOCK_TOKENS,
    spec_tokens: Annotated[int, typer.Option(help=option_help("spec_tokens"))] = 0,
    spec_rollback: Annotated[StateRollback, typer.Option(help=option_help("spec_rollback"))]
    = StateRollback.CHECKPOINTS,
    draft_model: Annotated[str | None, typer.Option(help=option_help("draft_model"))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    *, ctx: typer.Context,
) -> None:
    """Plan a model's KV buffer as a chain: bands, page bytes, longest request,
    concurrency, token capacity - side by side with fixed per-class pools. Every figure is
    per tensor-parallel rank (one GPU); the buffer is the GPU's reported memory x
    --mem-fraction - one rank's weights - a 3 GiB engine reserve, unless --buffer-bytes
    gives it."""
    try:
        check_values(mem_fraction=mem_fraction, buffer_bytes=buffer_bytes, page_size=page_size,
                    tp=tp, prompt=prompt, output=output, slots_held=slots_held,
                    host_bytes=host_bytes, host_fraction=host_fraction,
                    host_interval=host_interval, spec_tokens=spec_tokens)
        if host_bytes is not None and host_fraction is not None:
            raise ConfigError("give --host-bytes or --host-fraction, not both")
        target = load_spec(model, config, spec_file=spec, kv_dtype=kv_dtype, tp=tp,
                           state_dtype=state_dtype, weight_format=weight_format)
        model_spec = (target if draft_model is None else
                      load_draft(target, draft_model, kv_dtype=kv_dtype, tp=tp,
                                 state_dtype=state_dtype))
        if draft_model is not None:
            check_draft_vocabulary(model, config, spec, draft_model)
        check_spec_tokens(spec_tokens, model_spec)
        check_mix_context(model_spec, prompt, output)
        gpu_spec = get_gpu(gpu)
        result = plan_capacity(model_spec, gpu_spec, tp=tp, mem_fraction=mem_fraction,
                               buffer_bytes=buffer_bytes, page_size=page_size, prompt=prompt,
                               output=output, slots_held=slots_held)
        draft = None
        if model_spec.draft is not None:
            draft = draft_report(result, plan_capacity(
                target, gpu_spec, tp=tp, mem_fraction=mem_fraction, buffer_bytes=buffer_bytes,
                page_size=page_size, prompt=prompt, output=output, slots_held=slots_held))
        _check_slots_held(slots_held, result.layout)
        host = None
        if host_bytes is not None or host_fraction is not None:
            host = host_report(result, host_bytes, host_fraction, host_interval)
        speculative = (speculative_capacity(result.layout, prompt, output, spec_tokens,
                                            spec_rollback) if spec_tokens else None)
    except KVChainError as exc:
        fail(exc)
    warn_buffer(model_spec, gpu_spec, buffer_bytes, spec_file=spec, reads_weights=False)
    if buffer_bytes is not None and option_typed(ctx, "mem_fraction"):
        warn(mem_fraction_unused(mem_fraction))
    note_defaults(model_spec, config)
    if slots_held is not None and not result.layout.indices_of(LifetimeClass.STATE):
        warn(f"--slots-held {slots_held:,} changes nothing: {model_spec.name} has no "
             f"state band")
    if draft_model is not None and not spec_tokens:
        note(f"--draft-model {draft_model} without --spec-tokens: the figures price the "
             f"draft's weights and KV, not its drafts (give --spec-tokens k to price k "
             f"drafts per decode)")
    typed = frozenset(n for n in ("spec_rollback",) if option_typed(ctx, n))
    for message in speculative_warnings(spec_tokens, spec_rollback, typed, result.layout):
        warn(message)
    if as_json:
        print(json.dumps(plan_report(result, host, speculative, draft), indent=2))
        return
    console = out_console()
    _print_plan(console, result)
    if draft is not None:
        _print_draft(console, draft)
    if speculative is not None:
        _print_speculative(console, speculative, result.layout)
    if host is not None:
        _print_host(console, host)


def _check_slots_held(slots_held: int | None, layout: ChainLayout) -> None:
    """Refuse more state slots held than the chain holds with room for one token's page:
    its token capacity would be 0 for want of room, and both sides' rows would vanish
    from the table (a model without a state band is warned about instead: it holds no
    slot).

    Raises:
        ConfigError: ``slots_held`` past :func:`~kvchain.capacity.most_state_slots`.
    """
    if slots_held is None:
        return
    most = most_state_slots(layout)
    if most is not None and slots_held > most:
        raise ConfigError(f"--slots-held {slots_held:,} passes the {most:,} state slots "
                          f"this buffer holds with room for a page of tokens: no token "
                          f"capacity to measure (give at most {most:,})")


def _print_speculative(console: Console, spec: SpeculativeCapacity,
                       layout: ChainLayout) -> None:
    """One line: the concurrency with ``k`` drafts per decode beside ``k = 0``, and what
    the drafts hold on ``layout``'s bands (state slots only with a state band, ``W + k``
    window tokens only with a window band, ``C + k`` chunk tokens only with a chunked-local
    band; every band holds ``k`` more tokens)."""
    holds = ["k more tokens of every band"]
    if layout.indices_of(LifetimeClass.STATE):
        holds.append(f"{spec.rollback.value}: " + (
            "k more state slots per request" if spec.rollback is StateRollback.CHECKPOINTS
            else "1 more state slot per request, the accepted tokens replayed"))
    if layout.indices_of(LifetimeClass.WINDOW):
        holds.append("W + k window tokens until verified")
    if layout.indices_of(LifetimeClass.LOCAL):
        holds.append("C + k chunk tokens until verified")
    pools = (f"{spec.pools_concurrent:,}" if spec.pools_holds_none is None
             else f"none ({spec.pools_holds_none})")
    console.print(f"speculative decoding, k = {spec.spec_tokens} drafts per decode "
                  f"(--spec-tokens; {', '.join(holds)}): concurrent requests "
                  f"{spec.chain_concurrent:,} on the chain (k = 0: {spec.chain_plain:,}), "
                  f"{pools} in the fixed pools (k = 0: {spec.pools_plain:,})")


@dataclass(frozen=True, slots=True)
class DraftReport:
    """The draft model part of ``plan`` (``--draft-model``): what its bands cost and the
    concurrency with it beside the target alone.

    Attributes:
        name: the draft model.
        kind: how it joins (:class:`~kvchain.model.spec.DraftKind` value).
        bands: its bands as ``(label, bytes per token, bytes per slot)``.
        bytes_per_token: bytes per token over its token bands (full, window, local), B.
        bytes_per_slot: bytes per request of its state bands, B.
        weight_bytes: its weights on one rank, B (taken from the KV buffer).
        buffer_bytes, buffer_bytes_alone: the KV buffer with the draft and without it, B.
        chain_concurrent, chain_concurrent_alone: requests of the mix that fit together
            on the chain with the draft's bands and on the target's alone (its bigger
            buffer).
        pools_concurrent, pools_concurrent_alone: the same for the fixed pools.
    """

    name: str
    kind: str
    bands: tuple[tuple[str, int, int], ...]
    bytes_per_token: int
    bytes_per_slot: int
    weight_bytes: int
    buffer_bytes: int
    buffer_bytes_alone: int
    chain_concurrent: int
    chain_concurrent_alone: int
    pools_concurrent: int
    pools_concurrent_alone: int


def draft_report(with_draft: CapacityPlan, alone: CapacityPlan) -> DraftReport:
    """The draft part of a plan: ``with_draft`` (the joined model's plan) beside ``alone``
    (the target's, same GPU, memory fraction and request mix)."""
    model = with_draft.model
    assert model.draft is not None and model.draft_kind is not None
    bands = model.draft_bands
    return DraftReport(
        model.draft.name, model.draft_kind.value,
        tuple((c.label, c.bytes_per_token, c.bytes_per_slot) for c in bands),
        sum(c.bytes_per_token for c in bands), sum(c.bytes_per_slot for c in bands),
        model.draft.weight_bytes, with_draft.budget.buffer_bytes, alone.budget.buffer_bytes,
        with_draft.chain.concurrent_requests, alone.chain.concurrent_requests,
        with_draft.pools.concurrent_requests, alone.pools.concurrent_requests)


def _print_draft(console: Console, draft: DraftReport) -> None:
    """One line: the draft's bands and weights, and the concurrency with and without it."""
    bands = ", ".join(f"{label} {per_token:,} B/token" if per_token else
                      f"{label} {per_slot:,} B/slot" for label, per_token, per_slot in draft.bands)
    console.print(f"draft model {draft.name} ({draft.kind}; --draft-model): "
                  f"{bands or 'no bands (shares the target KV)'}, weights "
                  f"{draft.weight_bytes:,} B (KV buffer {draft.buffer_bytes:,} B, alone "
                  f"{draft.buffer_bytes_alone:,} B): concurrent requests "
                  f"{draft.chain_concurrent:,} on the chain (target alone: "
                  f"{draft.chain_concurrent_alone:,}), {draft.pools_concurrent:,} in the fixed "
                  f"pools (alone: {draft.pools_concurrent_alone:,})")


@dataclass(frozen=True, slots=True)
class HostReport:
    """The host tier part of ``plan`` (``--host-bytes`` / ``--host-fraction``).

    Attributes:
        tier: the split and the prefix it holds
            (:func:`kvchain.cache.host_tier.host_tier_plan`).
        given: how the bytes were given, in words (``"--host-bytes"``, or the fraction of
            this machine's memory).
        hit_tokens: the host hit priced for the request mix's prompt: its last resume point
            before the prompt's last token, at most what the tier holds
            (``tier.resumable_tokens``; 0: the prompt is shorter than one interval, or the
            tier holds none).
        limited_by_tier: True when the tier holds less than the prompt's last resume point,
            so the hit priced is the tier's whole content.
        hit_bytes: bytes that hit loads back (:func:`kvchain.cache.host_tier.hit_load_bytes`).
        timing: what the hit saves the prompt's TTFT (``None`` when it cannot be priced:
            no hit, a model without weights, or a GPU without a host link figure).
        why_unpriced: why ``timing`` is ``None`` (empty otherwise).
    """

    tier: HostTierPlan
    given: str
    hit_tokens: int
    limited_by_tier: bool
    hit_bytes: int
    timing: HostHitTiming | None
    why_unpriced: str


def host_report(result: CapacityPlan, host_bytes: int | None, host_fraction: float | None,
                interval_tokens: int) -> HostReport:
    """The host tier of a plan: ``host_bytes``, or ``host_fraction`` of this machine's
    memory (:func:`kvchain.gpu.local_host_memory_bytes`), split by resume interval; and the
    TTFT a host hit saves a prompt of the request mix against recompute
    (:func:`kvchain.sim.cost.host_hit_ttft`, layer-wise overlap, the default cost model).

    Raises:
        ConfigError: neither size given, bad values, or no physical-memory figure.
    """
    if host_bytes is None:
        if host_fraction is None:
            raise ConfigError("a host tier needs --host-bytes or --host-fraction")
        total = local_host_memory_bytes()
        host_bytes = int(total * host_fraction)
        given = f"--host-fraction {host_fraction:g} of this machine's {total:,} B"
    else:
        given = "--host-bytes"
    tier = host_tier_plan(result.layout, host_bytes, interval_tokens)
    k = tier.interval_tokens
    prompt_hit = (result.prompt - 1) // k * k
    # A hit cannot load more than the tier holds (m x K tokens, itself a resume point).
    hit = min(prompt_hit, tier.resumable_tokens)
    hit_bytes = hit_load_bytes(result.layout, hit)
    timing, why = None, ""
    if prompt_hit == 0:
        why = f"a {result.prompt:,}-token prompt is shorter than one resume interval"
    elif tier.resumes_without_bytes:
        why = ("a resume point of this model needs no KV bytes (every class's tail at a "
               "point is empty), so a host tier has nothing to load")
    elif hit == 0:
        why = (f"the host tier holds no resume interval (one needs {tier.interval_bytes:,} B "
               f"and the regions' alignment; {tier.host_bytes:,} B given)")
    elif result.gpu.host_link is None:
        why = f"{result.gpu.name} has no host link figure"
    else:
        try:
            timing = host_hit_ttft(GPUCostModel(result.model, result.gpu), result.prompt, hit,
                                   hit_bytes)
        except KVChainError as exc:  # e.g. a spec file without weights
            why = str(exc)
    return HostReport(tier, given, hit, hit < prompt_hit, hit_bytes, timing, why)


def plan_report(result: CapacityPlan, host: HostReport | None = None,
                speculative: SpeculativeCapacity | None = None,
                draft: DraftReport | None = None) -> dict[str, object]:
    """The JSON document of ``plan --json``. Keys (bytes, tokens, requests; all per
    tensor-parallel rank: ``"scope": "per rank"``, ``"tp"``):

    ``model``, ``gpu``, ``tp``, ``scope``; ``gpu_memory_bytes`` (the device's reported
    memory), ``mem_fraction``, ``weight_bytes`` (one rank's), ``engine_reserve_bytes``
    (activations, CUDA context, NCCL) and its former name ``activation_reserve_bytes`` -
    all ``null`` when ``--buffer-bytes`` gave the buffer; ``buffer_bytes``; ``page_size``,
    ``chain``, ``bands``; ``request``; ``chain_capacity`` and ``fixed_pools_capacity``
    (longest request, its bound, concurrency, full-attention tokens with slots held, and
    ``holds_none``: why that side holds no request at all, else ``null``);
    ``max_context_tokens``; ``host_tier`` (``null`` without ``--host-bytes`` /
    ``--host-fraction``; :func:`_host_dict`); ``speculative`` (``null`` without
    ``--spec-tokens``: ``spec_tokens``, ``rollback``, the concurrency with and without the
    drafts on both sides, ``pools_holds_none``); ``draft`` (``null`` without
    ``--draft-model``: :class:`DraftReport`'s fields, ``bands`` as ``band``,
    ``bytes_per_token``, ``bytes_per_slot``).
    """
    budget, layout = result.budget, result.layout
    return {
        "model": result.model.name, "gpu": result.gpu.name, "tp": result.tp,
        "scope": "per rank",
        "gpu_memory_bytes": budget.gpu_memory_bytes, "mem_fraction": budget.mem_fraction,
        "weight_bytes": budget.weight_bytes,
        "engine_reserve_bytes": budget.reserve_bytes,
        "activation_reserve_bytes": budget.reserve_bytes,
        "buffer_bytes": budget.buffer_bytes,
        "page_size": layout.page_size, "chain": layout.shape_name,
        "defaulted": [{"field": d.field, "value": d.value, "by": d.by}
                      for d in result.model.defaulted],
        "bands": [{"band": b.label, "anchor": b.anchor.value, "page_bytes": b.page_bytes,
                   "bytes_per_token": b.cache_class.bytes_per_token,
                   "bytes_per_slot": b.cache_class.bytes_per_slot,
                   "window": b.cache_class.window, "null_pages": b.reserved_pages}
                  for b in layout.bands],
        "request": {"prompt": result.prompt, "output": result.output},
        "chain_capacity": _as_dict(result.chain, result.chain_longest),
        "fixed_pools_capacity": _as_dict(result.pools, result.pools_longest),
        "max_context_tokens": result.model.max_context_tokens,
        "host_tier": None if host is None else _host_dict(host),
        "speculative": None if speculative is None else {
            "spec_tokens": speculative.spec_tokens, "rollback": speculative.rollback.value,
            "chain_concurrent": speculative.chain_concurrent,
            "chain_concurrent_k0": speculative.chain_plain,
            "pools_concurrent": speculative.pools_concurrent,
            "pools_concurrent_k0": speculative.pools_plain,
            "pools_holds_none": speculative.pools_holds_none},
        "draft": None if draft is None else {
            "name": draft.name, "kind": draft.kind,
            "bands": [{"band": b, "bytes_per_token": t, "bytes_per_slot": s}
                      for b, t, s in draft.bands],
            "bytes_per_token": draft.bytes_per_token, "bytes_per_slot": draft.bytes_per_slot,
            "weight_bytes": draft.weight_bytes, "buffer_bytes": draft.buffer_bytes,
            "buffer_bytes_alone": draft.buffer_bytes_alone,
            "chain_concurrent": draft.chain_concurrent,
            "chain_concurrent_alone": draft.chain_concurrent_alone,
            "pools_concurrent": draft.pools_concurrent,
            "pools_concurrent_alone": draft.pools_concurrent_alone},
    }


def _host_dict(host: HostReport) -> dict[str, object]:
    """``host_tier`` of ``plan --json``: ``host_bytes``, ``given``, ``interval_tokens``,
    ``interval_bytes``, ``intervals``, ``resumable_tokens``, ``used_bytes``,
    ``every_page_resumes``, ``classes`` (per band: ``band``, ``page_bytes``,
    ``per_interval``, ``slots``, ``bytes``), and ``hit``: the priced host hit of the request
    mix's prompt (``tokens``, ``limited_by_tier``, ``load_bytes``, and in seconds
    ``load_s``, ``with_hit_s``, ``recompute_s``, ``saved_s``, ``null`` with
    ``why_unpriced`` when it cannot be priced)."""
    tier, t = host.tier, host.timing
    return {
        "host_bytes": tier.host_bytes, "given": host.given,
        "interval_tokens": tier.interval_tokens, "interval_bytes": tier.interval_bytes,
        "intervals": tier.intervals, "resumable_tokens": tier.resumable_tokens,
        "used_bytes": tier.used_bytes, "every_page_resumes": tier.every_page_resumes,
        "classes": [{"band": c.label, "page_bytes": c.page_bytes,
                     "per_interval": c.per_interval, "slots": c.slots, "bytes": c.nbytes}
                    for c in tier.classes],
        "hit": {"tokens": host.hit_tokens, "limited_by_tier": host.limited_by_tier,
                "load_bytes": host.hit_bytes,
                "load_s": None if t is None else t.load_s,
                "with_hit_s": None if t is None else t.with_hit_s,
                "recompute_s": None if t is None else t.recompute_s,
                "saved_s": None if t is None else t.saved_s,
                "overlap": LoadOverlap.LAYERWISE.value,
                "link_efficiency": DEFAULT_HOST_LINK_EFFICIENCY,
                "why_unpriced": host.why_unpriced or None},
    }


def _print_host(console: Console, host: HostReport) -> None:
    tier = host.tier
    spacing = ("every page boundary resumes (no window or state class)"
               if tier.every_page_resumes else
               f"a resume point every {tier.interval_tokens:,} tokens (--host-interval)")
    parts = ", ".join(f"{c.label} {c.per_interval} x {c.page_bytes:,} B"
                      for c in tier.classes)
    console.print(Text.assemble(
        f"host tier {tier.host_bytes:,} B ({host.given}), {spacing}: ",
        (f"{tier.resumable_tokens:,}", "bold"), " tokens of resumable prefix "
        f"({tier.intervals:,} intervals of {tier.interval_bytes:,} B: {parts})"))
    table = Table(title="host tier by class")
    for col in ("class", "page bytes", "per interval", "slots", "bytes"):
        table.add_column(col, justify="left" if col == "class" else "right")
    for c in tier.classes:
        table.add_row(c.label, f"{c.page_bytes:,}", f"{c.per_interval:,}", f"{c.slots:,}",
                      f"{c.nbytes:,}")
    console.print(table)
    t = host.timing
    if t is None:
        console.print(f"host hit not priced: {host.why_unpriced}")
        return
    verdict = (f"saves {t.saved_s * 1e3:,.1f} ms" if t.saved_s >= 0
               else f"costs {-t.saved_s * 1e3:,.1f} ms more than recomputing")
    whole = " (all the tier holds)" if host.limited_by_tier else ""
    console.print(f"a host hit of {host.hit_tokens:,} tokens{whole} loads {host.hit_bytes:,} B in "
                  f"{t.load_s * 1e3:,.1f} ms (at {DEFAULT_HOST_LINK_EFFICIENCY:g} of the host "
                  f"link's rate); with the load overlapped layer by layer the prompt's first "
                  f"forward takes {t.with_hit_s * 1e3:,.1f} ms against "
                  f"{t.recompute_s * 1e3:,.1f} ms to recompute it: {verdict} of TTFT")


def _print_plan(console: Console, result: CapacityPlan) -> None:
    budget, layout, gpu_spec = result.budget, result.layout, result.gpu
    ours, pools = result.chain, result.pools
    ours_longest, pools_longest = result.chain_longest, result.pools_longest
    context = result.model.max_context_tokens
    prompt, output = result.prompt, result.output
    scope = (f"per rank of --tp {result.tp} (every figure below is one GPU's)" if result.tp > 1
             else "one GPU")
    if budget.given:
        source = " (--buffer-bytes)"
    else:
        assert budget.gpu_memory_bytes is not None and budget.weight_bytes is not None
        assert budget.reserve_bytes is not None
        source = (f" = floor({budget.gpu_memory_bytes:,} B reported x {budget.mem_fraction}) "
                  f"- weights {budget.weight_bytes:,} - engine reserve "
                  f"{budget.reserve_bytes:,} (activations, CUDA context, NCCL; CUDA graphs "
                  f"in the other {1 - (budget.mem_fraction or 0):.2g})")
    console.print(Text.assemble((result.model.name, "bold"), f" on {gpu_spec.name}, {scope}: "
                                f"KV buffer {budget.buffer_bytes:,} B{source}"), soft_wrap=False)
    console.print(band_table(layout))
    table = Table(title=f"capacity for ({prompt:,} prompt, {output:,} output) requests"
                        + (f", per rank (tp {result.tp})" if result.tp > 1 else ""))
    table.add_column("")
    table.add_column("chain", justify="right")
    table.add_column("fixed pools", justify="right")
    table.add_column("chain/pools", justify="right")
    has_state = bool(layout.indices_of(LifetimeClass.STATE))  # any owner's
    for label, a, b in _capacity_rows(ours, pools, ours_longest, pools_longest, has_state):
        table.add_row(label, _count(a), _count(b),
                      f"{a / b:.2f}x" if isinstance(a, int) and isinstance(b, int) and b
                      else "-")
    console.print(table)
    if ours.longest_request_tokens is None:
        console.print("longest request: unbounded (KV) - no full-attention layer (window, "
                      "chunked and state bytes are capped per request); the limit is "
                      + (_context_words(result.model) if context else
                         "the model's context length (not given by this config)"))
    else:
        assert pools.longest_request_tokens is not None
        console.print(f"longest lone request bound by: {_BOUND_WORDS[ours_longest.bound]} "
                      f"(chain), {_BOUND_WORDS[pools_longest.bound]} (fixed pools); KV "
                      f"bytes allow "
                      f"{ours.longest_request_tokens:,} / {pools.longest_request_tokens:,} "
                      "tokens, "
                      + (_context_words(result.model) if context is not None
                         else "the model's context is unknown"))
    rules = []
    if has_state:
        r = MAMBA_FULL_MEMORY_RATIO
        rules.append(f"state pool = {r:g}/{1 + r:g} of the buffer (SGLang "
                     "--mamba-full-memory-ratio)")
    if layout.indices_of(LifetimeClass.WINDOW) or layout.indices_of(LifetimeClass.LOCAL):
        rules.append(f"window pool tokens = {SWA_FULL_TOKENS_RATIO:g} x full pool tokens (SGLang "
                     "--swa-full-tokens-ratio)")
    if rules:
        console.print("fixed pools: " + "; ".join(rules))
    if pools.holds_none is not None:
        console.print(f"fixed pools hold no request (0 concurrent): {pools.holds_none}")


def _capacity_rows(ours: Capacity, pools: Capacity, ours_longest: LongestRequest,
                   pools_longest: LongestRequest, has_state: bool
                   ) -> list[tuple[str, int | str, int | str]]:
    """Rows of the capacity table: each row measures both sides in the same conditions."""
    rows: list[tuple[str, int | str, int | str]] = [
        ("longest request (tokens)", _longest_cell(ours_longest), _longest_cell(pools_longest)),
        ("concurrent requests", ours.concurrent_requests, pools.concurrent_requests),
    ]
    if ours.full_tokens or pools.full_tokens:
        label = (f"full-attn tokens, both {ours.slots_held:,} slots" if has_state
                 else "full-attention tokens")
        rows.append((label, ours.full_tokens, pools.full_tokens))
    return rows


def check_mix_context(model: ModelSpec, prompt: int, output: int) -> None:
    """Refuse a request mix past the model's context (tokens, when the model gives one):
    the scheduler rejects a request of ``prompt + output > context`` on arrival, so every
    concurrency figure of such a mix would be 0, silently.

    Raises:
        ConfigError: ``prompt + output`` over ``model.max_context_tokens``.
    """
    context = model.max_context_tokens
    if context is not None and prompt + output > context:
        raise ConfigError(f"--prompt {prompt:,} + --output {output:,} tokens pass "
                          f"{_context_words(model)}: no request of this mix can run "
                          f"(give a shorter mix)")


def _context_words(model: ModelSpec) -> str:
    """Where ``model``'s context (tokens, known) comes from: its config's
    ``max_position_embeddings``, or with a draft joined the shorter of the target's and the
    draft's (:func:`~kvchain.model.with_draft` caps it: a draft computes every token)."""
    context = model.max_context_tokens
    if model.draft is None:
        return f"the model's context {context:,} tokens (max_position_embeddings)"
    return (f"the context {context:,} tokens (the shorter max_position_embeddings of the "
            f"target and the draft {model.draft.name})")


_BOUND_WORDS = {"kv_bytes": "the KV buffer", "context": "the context length"}
"""``LongestRequest.bound`` in words, for the plan's text (its JSON keeps the key)."""


def _longest_cell(longest: LongestRequest) -> int | str:
    if longest.tokens is None:
        return "unbounded (KV)"
    return longest.tokens if longest.bound == "kv_bytes" else f"{longest.tokens:,} (context)"


def _count(value: int | str) -> str:
    return f"{value:,}" if isinstance(value, int) else value


def _as_dict(c: Capacity, longest: LongestRequest) -> dict[str, int | str | None]:
    return {"longest_request_tokens": longest.tokens,
            "longest_request_bound": longest.bound,
            "longest_request_tokens_kv_bound": c.longest_request_tokens,
            "concurrent_requests": c.concurrent_requests, "full_tokens": c.full_tokens,
            "slots_held": c.slots_held, "holds_none": c.holds_none}
