"""The client's one reading and writing of the episode spec grammar (`0,3-5,9`)."""

from __future__ import annotations

import pytest

from episerve._episodes import episode_count, episode_spec


def test_ids_in_any_order_become_ascending_ranges() -> None:
    assert episode_spec([9, 3, 0, 4, 5, 4]) == "0,3-5,9"


def test_a_spec_counts_each_id_once_however_often_it_is_named() -> None:
    assert episode_count("0,3-5,9") == 5
    assert episode_count(" 1 - 3 , 2-4,4") == 4


def test_a_wide_range_is_counted_without_listing_its_ids() -> None:
    assert episode_count("0-1000000000") == 1_000_000_001


def test_written_specs_count_their_ids() -> None:
    ids = [1, 2, 3, 7, 11, 12]
    assert episode_count(episode_spec(ids) or "") == len(ids)


def test_a_term_outside_the_grammar_is_refused() -> None:
    with pytest.raises(ValueError, match="'3-x'"):
        episode_count("1,3-x")
