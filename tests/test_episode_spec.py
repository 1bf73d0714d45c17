"""Property tests of the episode-spec parser and resolver (plain functions, no server)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import DoesNotExist, InvalidInput, OverLimit
from app.reads.episode_spec import format_ranges, parse_episode_spec, ranges_from_ids, resolve_episodes

terms = st.one_of(
    st.integers(0, 500).map(str),
    st.tuples(st.integers(0, 500), st.integers(0, 60)).map(lambda t: f"{t[0]}-{t[0] + t[1]}"),
)


def expand(spec: str) -> set[int]:
    ids: set[int] = set()
    for term in spec.split(","):
        first, _, last = term.strip().partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return ids


@given(st.lists(terms, min_size=1, max_size=30))
def test_parsed_ranges_cover_exactly_the_listed_ids(parts: list[str]) -> None:
    spec = ",".join(parts)
    ranges = parse_episode_spec(spec, 10_000)
    assert set().union(*(range(a, b + 1) for a, b in ranges)) == expand(spec)
    assert all(a <= b for a, b in ranges)
    assert all(b + 1 < c for (_, b), (c, _) in itertools.pairwise(ranges))  # merged and sorted


@given(st.lists(terms, min_size=1, max_size=30))
def test_formatting_round_trips(parts: list[str]) -> None:
    ranges = parse_episode_spec(",".join(parts), 10_000)
    assert parse_episode_spec(format_ranges(ranges), 10_000) == ranges


@given(st.text(max_size=40))
def test_arbitrary_text_is_parsed_or_rejected_with_invalid_request(text: str) -> None:
    try:
        ranges = parse_episode_spec(text, 10_000)
    except InvalidInput as exc:
        assert exc.detail
    else:
        assert ranges and all(0 <= a <= b for a, b in ranges)


@given(st.lists(st.integers(0, 300)), st.sets(st.integers(0, 300), min_size=1))
def test_resolution_is_the_sorted_intersection_or_names_the_missing(ids: list[int], known: set[int]) -> None:
    known_array = np.array(sorted(known), dtype=np.int64)
    ranges = ranges_from_ids(ids)
    missing = set(ids) - known
    if missing:
        with pytest.raises(DoesNotExist) as raised:
            resolve_episodes(ranges, known_array)
        assert str(min(missing)) in raised.value.detail
    else:
        assert resolve_episodes(ranges, known_array).tolist() == sorted(set(ids))


def test_overlong_spec_is_too_large_and_reports_the_limit() -> None:
    with pytest.raises(OverLimit) as raised:
        parse_episode_spec("1," * 20, 16)
    assert raised.value.limit == 16


def test_negative_ids_in_a_list_are_invalid() -> None:
    with pytest.raises(InvalidInput):
        ranges_from_ids([3, -1])


@pytest.mark.parametrize(
    ("spec", "phrase"),
    [
        ("9" * 4301, "episode id 99999999999999999999... (4301 digits) in episodes spec is too large"),
        ("3,1-" + "9" * 25, "episode id 9999999999999999999999999 in episodes spec is too large"),
        (str(2**62 + 1), f"episode id {2**62 + 1} in episodes spec is too large; the largest is {2**62}"),
    ],
)
def test_episode_ids_past_the_largest_are_refused_without_converting_them(spec: str, phrase: str) -> None:
    with pytest.raises(InvalidInput, match=phrase.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        parse_episode_spec(spec, 10_000)


def test_leading_zeros_do_not_make_an_episode_id_too_large() -> None:
    assert parse_episode_spec("0" * 40 + "7," + str(2**62), 1000) == [(7, 7), (2**62, 2**62)]
