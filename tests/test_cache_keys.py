"""Content keys: hash-chain semantics, derived by hand on tiny prompts."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvchain.cache.keys import page_keys_from_blocks, page_keys_from_tokens
from kvchain.errors import InvalidRequestError


def test_token_keys_share_exactly_the_common_whole_pages():
    a = page_keys_from_tokens([1, 2, 3, 4, 5, 6, 7], 2)  # 3 whole pages, token 7 partial
    b = page_keys_from_tokens([1, 2, 3, 4, 9, 6], 2)  # differs in page 2
    assert len(a) == 3 and len(b) == 3
    assert a[:2] == b[:2] and a[2] != b[2]
    # A page's key depends on its parent: same tokens after a different prefix differ.
    c = page_keys_from_tokens([0, 2, 3, 4], 2)
    assert c[1] != a[1]


def test_block_keys_follow_blocks_and_the_partial_last_block():
    # Blocks of 4 tokens, pages of 2: prompt of 10 tokens = blocks (7, 8, 9), the last one
    # partial (2 tokens); 5 whole pages.
    a = page_keys_from_blocks([7, 8, 9], 4, 10, 2)
    b = page_keys_from_blocks([7, 8, 5], 4, 10, 2)  # third block differs
    c = page_keys_from_blocks([7, 6, 9], 4, 10, 2)  # second block differs
    assert len(a) == 5
    assert a[:4] == b[:4] and a[4] != b[4]
    assert a[:2] == c[:2] and a[2] != c[2] and a[4] != c[4]
    # Pages of 3 tokens straddle blocks: page 1 = tokens [3, 6) covers blocks 0 and 1.
    d = page_keys_from_blocks([7, 8, 9], 4, 10, 3)
    e = page_keys_from_blocks([7, 1, 9], 4, 10, 3)
    assert len(d) == 3 and d[0] == e[0] and d[1] != e[1]


@pytest.mark.parametrize("args", [([1, 2], 4, 10, 2), ([1, -1, 2], 4, 10, 2),
                                  ([1, 2, 3], 0, 10, 2), ([1, 2, 3], 4, 10, True)])
def test_bad_block_input_is_refused(args):
    with pytest.raises(InvalidRequestError):
        page_keys_from_blocks(*args)


def test_bad_tokens_are_refused():
    with pytest.raises(InvalidRequestError):
        page_keys_from_tokens([1, -2], 1)
    with pytest.raises(InvalidRequestError):
        page_keys_from_tokens([1, 2], 0)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 400), st.randoms())
def test_block_keys_are_the_formula_for_every_page(block, page, prompt, rng):
    # key j = hash(key j - 1, (j + 1)P, ids of blocks jP // B .. ((j + 1)P - 1) // B),
    # written out page by page (the function reuses a block's slice across its pages)
    ids = [rng.randrange(5) for _ in range(-(-prompt // block))]
    keys, parent = [], 0
    for j in range(prompt // page):
        end = (j + 1) * page
        parent = hash((parent, end, *ids[j * page // block:(end - 1) // block + 1]))
        keys.append(parent)
    assert page_keys_from_blocks(ids, block, prompt, page) == tuple(keys)


@pytest.mark.parametrize("ids, shown", [((1, True), "True"), ((-1, 2), "-1"), ((1, 2.0), "2.0"),
                                        ((1, "2"), "'2'"), ((1, None), "None")])
def test_block_ids_refuse_the_first_bad_id_by_name(ids, shown):
    """20 tokens in blocks of 16 take 2 ids, each an int >= 0: the first bad one is named
    (a bool is an int in Python, refused all the same); (1, 2) gives 20 // 4 = 5 keys."""
    with pytest.raises(InvalidRequestError, match=f"non-negative ints, got {re.escape(shown)}$"):
        page_keys_from_blocks(ids, 16, 20, 4)
    assert len(page_keys_from_blocks((1, 2), 16, 20, 4)) == 5
