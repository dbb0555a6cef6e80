"""The decode step runs the band policies' formulas over the rows' Python ints for up to
``SCALAR_ROWS`` rows and over numpy columns above (``RequestTable.decode_rows`` and
``refresh_need``): both give what the per-request formulas give.

The check forces each side for every batch size (``SCALAR_ROWS`` patched to 0: numpy
always; to 10,000: ints always) on the same random decode stream of a state | window |
full chain (``P = 16``, ``W = 32`` tokens) with speculative drafts, and compares every
step's demands with ``KVManager.demand`` request by request, the need thresholds, the
held pages and the chain between the two managers.
"""

from __future__ import annotations

import random

import pytest

from kvchain.alloc.chain import Chain
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC
from kvchain.requests import table as table_module
from kvchain.requests.manager import KVManager

P = 16


def manager() -> KVManager:
    layout = plan_layout([declared_class(LC.STATE, 48_000), declared_class(LC.WINDOW, 1_000, 32),
                          declared_class(LC.FULL, 1_000)], 30_000_000, P)
    return KVManager(Chain(layout), None, 2)  # up to 2 drafts a step


def stream(monkeypatch: pytest.MonkeyPatch, scalar_rows: int, seed: int) -> list[object]:
    """Run 40 steps of 12 requests (prompts 1-80 tokens, drafts 0-2 per step) and return
    what each step saw: the demands, the need thresholds and the held pages."""
    monkeypatch.setattr(table_module, "SCALAR_ROWS", scalar_rows)
    rng = random.Random(seed)
    kv = manager()
    rids = list(range(12))
    prompts = [rng.randint(1, 80) for _ in rids]
    kv.allocate(list(zip(rids, prompts, strict=True)))
    for rid, n in zip(rids, prompts, strict=True):
        kv.commit(rid, n)
    seen: list[object] = []
    for _ in range(40):
        drafts = rng.choice((0, 0, 1, 2))
        batch = rng.sample(rids, rng.randint(1, len(rids)))
        demands = kv.decode_demands(batch, drafts)
        # equal to the per-request formula (request_demand), row by row
        assert list(demands) == [kv.demand(rid, 1 + drafts) for rid in batch]
        kv.allocate([(rid, 1 + drafts) for rid in batch], demands)
        if drafts:
            kv.verify(batch, [rng.randint(0, drafts) for _ in batch], drafts)
        else:
            kv.commit_decodes(batch)
        kv.audit()
        table = kv._table
        slots = [table.slot_of[rid] for rid in rids]
        seen.append((list(demands), table.need_at[slots].tolist(),
                     [kv.held(rid) for rid in rids]))
    seen.append(kv.chain.snapshot())
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_int_and_numpy_paths_of_the_decode_formulas_agree(monkeypatch, seed) -> None:
    numpy_always = stream(monkeypatch, 0, seed)
    ints_always = stream(monkeypatch, 10_000, seed)
    assert ints_always == numpy_always


def test_a_wrong_int_path_is_caught_by_the_per_request_equality(monkeypatch) -> None:
    # Sibling: an int path that forgets the window band's pages (a planted defect) makes
    # the step's demands differ from the per-request formula on the first crossing.
    real = table_module.RequestTable.decode_rows

    def no_window(self, slots, extend=1):  # type: ignore[no-untyped-def]
        at, rows, matrix = real(self, slots, extend)
        matrix = matrix.copy()
        matrix[:, 1] = 0
        return at, [(r[0], 0, r[2]) for r in rows], matrix

    monkeypatch.setattr(table_module.RequestTable, "decode_rows", no_window)
    with pytest.raises(AssertionError):
        stream(monkeypatch, 10_000, 0)
