"""Window policy: durations, generation rollover and expiry decisions (pure, no RocksDB)."""

from __future__ import annotations

import pytest

from dedup_contract.window import (
    Generation,
    WindowPolicy,
    format_duration_ms,
    generations_to_drop,
    parse_duration_ms,
    place_batch,
)

H = 3_600_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("672h", 672 * H),
        ("30m", 30 * 60_000),
        ("15s", 15_000),
        ("7d", 7 * 24 * H),
        ("500ms", 500),
        ("1h30m", 90 * 60_000),
        ("1d12h", 36 * H),
        (" 2h ", 2 * H),
        ("0s", 0),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", "h", "10", "1.5h", "-1h", "1w", "1h 30m", "30m1h", "1h1h", "1H", "abc", "5s5"]
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration_ms(text)


@pytest.mark.parametrize("ms", [0, 1, 999, 1000, 90_000, 672 * H, 30 * 24 * H, 36 * H + 5])
def test_format_duration_round_trips(ms: int) -> None:
    assert parse_duration_ms(format_duration_ms(ms)) == ms


def test_format_duration_is_short() -> None:
    assert format_duration_ms(672 * H) == "28d"
    assert format_duration_ms(90 * 60_000) == "1h30m"


def test_policy_validation() -> None:
    with pytest.raises(ValueError, match="duration, a key bound, or both"):
        WindowPolicy()
    with pytest.raises(ValueError, match="positive"):
        WindowPolicy(duration_ms=0)
    with pytest.raises(ValueError, match="positive"):
        WindowPolicy(max_keys=-5)
    assert WindowPolicy.from_spec("7d", None) == WindowPolicy(7 * 24 * H, None)
    assert WindowPolicy.from_spec(None, 10) == WindowPolicy(None, 10)
    with pytest.raises(ValueError):
        WindowPolicy.from_spec(None, None)


def test_generation_sizes() -> None:
    policy = WindowPolicy(duration_ms=800, max_keys=1000)
    assert policy.keys_per_generation(8) == 125
    assert policy.span_per_generation_ms(8) == 100
    assert WindowPolicy(max_keys=10).keys_per_generation(8) == 2  # rounded up
    assert WindowPolicy(max_keys=1).keys_per_generation(8) == 1
    assert WindowPolicy(max_keys=10).span_per_generation_ms(8) is None
    assert WindowPolicy(duration_ms=10).keys_per_generation(8) is None


def gen(number: int, opened: int, newest: int, keys: int, oldest: int | None = None) -> Generation:
    return Generation(number, opened, opened if oldest is None else oldest, newest, keys)


def test_generation_with_keys_tracks_bounds() -> None:
    g = Generation.opened(3, 1000).with_keys(5, 1200).with_keys(2, 900)
    assert g == Generation(3, 1000, 900, 1200, 7)


def test_place_batch_without_a_generation_opens_one() -> None:
    assert place_batch(WindowPolicy(max_keys=100), None, 5, 0, 4) == [0, 5]
    assert place_batch(WindowPolicy(duration_ms=100), None, 5, 0, 4) == [0, 5]


def test_place_batch_fills_current_then_splits_by_capacity() -> None:
    policy = WindowPolicy(max_keys=100)  # 25 per generation with 4 generations
    current = gen(0, 0, 0, 20)
    assert place_batch(policy, current, 3, 0, 4) == [3]
    assert place_batch(policy, current, 5, 0, 4) == [5]
    assert place_batch(policy, current, 6, 0, 4) == [5, 1]
    assert place_batch(policy, current, 60, 0, 4) == [5, 25, 25, 5]
    assert place_batch(policy, gen(0, 0, 0, 25), 1, 0, 4) == [0, 1]
    assert place_batch(policy, current, 0, 0, 4) == [0]


def test_place_batch_rolls_over_by_time() -> None:
    policy = WindowPolicy(duration_ms=400)  # a generation stays open 100 ms with 4
    current = gen(0, 1000, 1050, 10)
    assert place_batch(policy, current, 7, 1099, 4) == [7]
    assert place_batch(policy, current, 7, 1100, 4) == [0, 7]
    # A timestamp older than the generation's opening never forces a rollover.
    assert place_batch(policy, current, 7, 10, 4) == [7]


def test_place_batch_time_and_count() -> None:
    policy = WindowPolicy(duration_ms=400, max_keys=100)
    assert place_batch(policy, gen(0, 1000, 1000, 24), 3, 1050, 4) == [1, 2]
    assert place_batch(policy, gen(0, 1000, 1000, 1), 3, 1200, 4) == [0, 3]


def test_drop_by_time_keeps_ids_at_least_the_duration() -> None:
    policy = WindowPolicy(duration_ms=1000)
    live = [gen(0, 0, 250, 5), gen(1, 250, 500, 5), gen(2, 500, 900, 5)]
    assert generations_to_drop(policy, live, 1250) == 0  # newest of gen 0 is exactly 1000 old
    assert generations_to_drop(policy, live, 1251) == 1
    assert generations_to_drop(policy, live, 1501) == 2
    assert generations_to_drop(policy, live, 1901) == 3
    assert generations_to_drop(policy, [], 10**12) == 0


def test_drop_by_time_is_oldest_first() -> None:
    policy = WindowPolicy(duration_ms=1000)
    # An older generation holding a late timestamp shields the ones after it.
    live = [gen(0, 0, 5000, 5), gen(1, 250, 500, 5)]
    assert generations_to_drop(policy, live, 3000) == 0


def test_drop_by_count_oldest_first_until_within_bound() -> None:
    policy = WindowPolicy(max_keys=100)
    live = [gen(0, 0, 0, 25), gen(1, 0, 0, 25), gen(2, 0, 0, 25), gen(3, 0, 0, 25)]
    assert generations_to_drop(policy, live, 0) == 0
    assert generations_to_drop(policy, [*live, gen(4, 0, 0, 1)], 0) == 1
    assert generations_to_drop(policy, [*live, gen(4, 0, 0, 25), gen(5, 0, 0, 26)], 0) == 3


def test_drop_by_time_then_count() -> None:
    policy = WindowPolicy(duration_ms=1000, max_keys=50)
    live = [gen(0, 0, 100, 30), gen(1, 100, 2000, 30), gen(2, 2000, 2500, 30)]
    assert generations_to_drop(policy, live, 1500) == 2  # gen 0 by time, gen 1 by count
    assert generations_to_drop(policy, live, 1000) == 2  # both by count
    assert generations_to_drop(policy, live[2:], 1000) == 0
