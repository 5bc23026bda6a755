"""Numbers for people: three significant figures, units, and never NaN or an exponent."""
import math

from batchlab.report import fmt


def test_three_significant_figures_without_exponents_and_thousands_in_full():
    assert [fmt.num(x) for x in (0.714286, 5.41, 0.009848, 20.0, 1768.3, 123456.7, 1e-7, 0.0)] == \
        ["0.714", "5.41", "0.00985", "20", "1,768", "123,457", "0.0000001", "0"]


def test_units_rates_durations_shares_and_ratios():
    assert fmt.rate(0.714286) == "0.714 req/s" and fmt.rate(20.0) == "20 req/s"
    assert fmt.seconds(0.05) == "50 ms" and fmt.seconds(1.0) == "1 s" and fmt.seconds(2.604) == "2.6 s"
    assert fmt.share(0.08282) == "8.3 %" and fmt.share(1.0) == "100 %" and fmt.share(0.0) == "0 %"
    assert fmt.ratio(4.0) == "4×" and fmt.ratio(2.5) == "2.5×"
    assert fmt.repeats(1) == "median of 1 repeat" and fmt.repeats(3) == "medians of 3 repeats"
    assert fmt.count(2971, "request") == "2,971 requests" and fmt.count(1, "repeat") == "1 repeat"


def test_what_cannot_be_shown_is_a_dash_never_nan():
    for f in (fmt.num, fmt.seconds, fmt.share, fmt.change):
        assert f(math.nan) == "—" and f(math.inf) == "—"
    assert fmt.listing([]) == "" and fmt.listing(["a", "b", "c"]) == "a, b and c"
