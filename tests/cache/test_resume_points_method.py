"""``PrefixCache.resume_points``: the one method that owns a prompt's resume points and its
junction point (the request layer reads none of the cache's attributes for them)."""

from __future__ import annotations

import numpy as np
import pytest

from kvchain.cache.radix import CacheGeometry, PrefixCache, ResumePolicy
from kvchain.errors import InvalidRequestError
from kvchain.layout import plan_layout
from kvchain.model.declared import declared_class
from kvchain.model.layers import LifetimeClass as LC


def cache(junctions: bool = True) -> PrefixCache:
    """Window 32 tokens + full attention, 16-token pages, a resume point every 64 tokens
    (4 pages), block policy."""
    lay = plan_layout([declared_class(LC.WINDOW, 1_000, 32), declared_class(LC.FULL, 1_000)],
                      3_000_000, 16)
    return PrefixCache(CacheGeometry.of(lay), interval_tokens=64, policy=ResumePolicy.BLOCKS,
                       junctions=junctions, junction_min_tokens=16)


def test_the_points_of_a_ten_page_prompt_are_every_fourth_page_and_its_end() -> None:
    # 10 whole pages, interval 4 pages: 4, 8 and the last whole page 10; no match, no
    # junction
    assert cache().resume_points(10) == ((4, 8, 10), 0)


def test_a_match_past_the_hit_between_two_points_is_the_junction() -> None:
    # keys share 6 pages, the state resumes from 0: the deepest own point below 6 is 4, a
    # gain of 2 pages >= max(1, min(1, ceil(6 / 20))) = 1, so the junction is 6
    assert cache().resume_points(10, 0, 6) == ((4, 8, 10), 6)
    # a match ending on an own point (8) gains nothing over it: no junction
    assert cache().resume_points(10, 0, 8) == ((4, 8, 10), 0)


def test_the_sibling_with_junctions_off_has_no_junction() -> None:
    assert cache(junctions=False).resume_points(10, 0, 6) == ((4, 8, 10), 0)


@pytest.mark.parametrize("args", [(-1,), (10, -1), (10, 0, -2), (10.0,), (True,), ("10",)])
def test_a_bad_count_is_refused_typed(args: tuple[object, ...]) -> None:
    c = cache()
    with pytest.raises(InvalidRequestError):
        c.resume_points(*args)  # type: ignore[arg-type]
    assert c.resume_points(10) == ((4, 8, 10), 0)  # nothing changed


def test_a_numpy_count_is_taken_as_its_int() -> None:
    assert cache().resume_points(np.int64(10), 0, np.int64(6)) == ((4, 8, 10), 6)  # type: ignore[arg-type]
