"""The bracket-and-bisect search on fake tests ("holds up to a rate"): where it opens, how it
widens and narrows, what stops it, and that rounds of several probes reach the same answer."""
import pytest

from batchlab.core.search import Bracket, inside, knee, ladder, significant


def threshold(knee_at: float, seen: list[float] | None = None):
    """A fake setting: holds every rate up to `knee_at`; records the rates it was asked."""
    def holds(rate: float) -> bool:
        if seen is not None:
            seen.append(rate)
        return rate <= knee_at
    return holds


def test_rates_of_each_round():
    assert ladder(2, 200, 3) == [2.0, 20.0, 200.0]
    assert inside(10, 20, 1) == [15.0] and inside(10, 40, 2) == [20.0, 30.0]
    assert inside(10, 40, 1, geometric=True) == [20.0]
    assert significant(3)(123.456) == 123.0 and significant(4)(0.0123456) == 0.01235


@pytest.mark.parametrize("knee_at", [41.0, 55.0, 79.0])
def test_a_2x_bracket_settles_in_three_bisections_whichever_side_the_knee_is_on(knee_at):
    found = knee(threshold(knee_at), 40, 80, tolerance=0.10, snap=significant(3))
    rates = [r for r, _ in found.probes]
    assert rates[:2] == [40, 80] and len(rates) == 5          # both ends, then 3 geometric bisections
    assert found.settled and found.lo <= knee_at < found.hi and found.hi / found.lo - 1 <= 0.10


def test_arithmetic_midpoints_need_a_fourth_bisection_where_geometric_ones_do_not():
    geo = knee(threshold(41.0), 40, 80, tolerance=0.10)
    arith = knee(threshold(41.0), 40, 80, tolerance=0.10, geometric=False)
    assert len(geo.probes) == 5 and len(arith.probes) == 6
    assert arith.settled and arith.lo <= 41 < arith.hi


def test_the_lower_end_first_and_the_upper_only_if_it_held():
    seen: list[float] = []
    knee(threshold(12.0, seen), 40, 80, tolerance=0.10)
    assert 80 not in seen                                      # 40 failed: 80 would too


def test_a_bracket_below_the_knee_moves_up_doubling_then_faster():
    seen: list[float] = []
    found = knee(threshold(200.0, seen), 40, 80, tolerance=0.10)
    assert seen[:4] == [40, 80, 160, 640]                      # x2, then x4: the ratio squares after each move
    assert found.lo <= 200 < found.hi and found.settled


def test_a_bracket_above_the_knee_moves_down():
    seen: list[float] = []
    found = knee(threshold(12.0, seen), 40, 80, tolerance=0.10)
    assert seen[:3] == [40, 20, 5]                             # /2, then /4
    assert found.lo <= 12 < found.hi and found.settled


def test_a_search_from_a_previous_bracket_takes_two_probes_when_the_knee_stayed():
    first = knee(threshold(55.0), 40, 80, tolerance=0.10)
    again = knee(threshold(55.0), first.lo, first.hi, tolerance=0.10)
    assert [r for r, _ in again.probes] == [first.lo, first.hi]
    assert again.settled and again.lo == first.lo


def test_a_knee_that_moved_is_found_again_in_a_few_probes():
    found = knee(threshold(70.0), 50, 54, tolerance=0.10)
    assert found.lo <= 70 < found.hi and found.settled and len(found.probes) <= 8


def test_the_cap_on_probes_and_a_search_that_never_held_or_never_failed():
    never = knee(lambda rate: False, 40, 80, tolerance=0.1, max_probes=6)
    assert never.lo is None and not never.settled and len(never.probes) <= 6
    always = knee(lambda rate: True, 40, 80, tolerance=0.1, max_probes=6)
    assert always.hi is None and not always.settled and len(always.probes) == 6
    floor = knee(lambda rate: False, 40, 80, tolerance=0.1)
    assert min(r for r, _ in floor.probes) >= 40 / 1000 and floor.lo is None   # gives up a thousandth below


def test_without_widening_ends_that_miss_the_knee_stop_the_search():
    low = knee(threshold(10.0), 40, 80, tolerance=0.1, widen=False)
    assert [r for r, _ in low.probes] == [40] and low.lo is None and low.hi == 40
    high = knee(threshold(100.0), 40, 80, tolerance=0.1, widen=False)
    assert [r for r, _ in high.probes] == [40, 80] and high.lo == 80 and high.hi is None


def test_rounding_that_leaves_nothing_new_between_the_ends_stops_it():
    found = knee(threshold(40.05), 40, 40.2, tolerance=0.0, snap=significant(3))
    assert found.next_round() == [] and not found.settled


@pytest.mark.parametrize("width", [2, 3, 5])
def test_rounds_of_several_probes_take_fewer_rounds_to_a_bracket_around_the_same_knee(width):
    one, many = Bracket(2, 80, 0.02, geometric=False, widen=False), Bracket(2, 80, 0.02, width, geometric=False, widen=False)
    rounds = {}
    for name, b in (("one", one), ("many", many)):
        rounds[name] = 0
        while rates := b.next_round():
            assert len(rates) <= b.width
            for r in rates:
                b.record(r, r <= 33.3)
            rounds[name] += 1
    assert rounds["many"] < rounds["one"]
    for b in (one, many):
        assert b.settled and b.lo <= 33.3 < b.hi


def test_probes_recorded_before_the_search_set_its_bracket():
    b = Bracket(1, 100, 0.05, geometric=False, widen=False, probes=[(10.0, True), (20.0, False)])
    assert b.next_round() == [15.0]


@pytest.mark.parametrize("kw", [dict(low=80, high=40), dict(low=0, high=40), dict(tolerance=-1), dict(width=0),
                                dict(max_probes=0)])
def test_bad_settings_are_refused(kw):
    with pytest.raises(ValueError):
        Bracket(**({"low": 40, "high": 80, "tolerance": 0.1} | kw))
