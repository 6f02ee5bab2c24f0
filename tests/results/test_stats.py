"""tasim.results.stats: Student t quantiles and intervals, against published table values."""

from __future__ import annotations

import pytest

from tasim.results.stats import Interval, mean_interval, paired_ratio, t_cdf, t_quantile


@pytest.mark.parametrize(("df", "quantile"), [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (29, 2.0452), (100, 1.9840)])
def test_t_quantiles_match_the_table(df: int, quantile: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(quantile, abs=5e-5)


def test_t_cdf_is_symmetric_and_exact_where_closed_form() -> None:
    assert t_cdf(0.0, 7) == 0.5
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(-2.0, 5) == pytest.approx(1 - t_cdf(2.0, 5))


def test_mean_interval_of_one_to_five() -> None:
    interval = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451 * (2.5**0.5) / 5**0.5  # t(0.975, 4) x sd / sqrt(n)
    assert (interval.mean, interval.n) == (3.0, 5)
    assert interval.low == pytest.approx(3.0 - half, abs=1e-6) and interval.high == pytest.approx(3.0 + half, abs=1e-6)
    assert mean_interval([2.5]).half_width == 0.0


def test_paired_ratio_is_the_interval_of_per_seed_ratios() -> None:
    ratio = paired_ratio([2.0, 4.0, 6.0], [1.0, 2.0, 3.0])
    assert ratio is not None and (ratio.mean, ratio.low, ratio.high) == (2.0, 2.0, 2.0)
    assert ratio.significant() is None  # the same ratio at every seed: no interval to judge by
    assert paired_ratio([1.0], [0.0]) is None
    with pytest.raises(ValueError, match="2 values against 1 baseline values"):
        paired_ratio([1.0, 2.0], [1.0])


def test_an_interval_judges_significance() -> None:
    interval = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    assert interval.no_interval is None
    assert (interval.significant(3.0), interval.significant(10.0)) == (False, True)
    assert interval.record() == {"mean": 3.0, "low": interval.low, "high": interval.high, "no_interval": None}


def test_one_seed_has_no_interval_and_no_verdict() -> None:
    interval = mean_interval([2.5])
    assert interval == Interval(2.5, 2.5, 2.5, 1)
    assert interval.no_interval == "1 seed: no interval"
    assert interval.significant(1.0) is None and interval.significant(2.5) is None
    assert interval.record() == {"mean": 2.5, "low": None, "high": None, "no_interval": "1 seed: no interval"}


def test_seeds_that_agree_have_no_interval_and_no_verdict() -> None:
    # fsum([0.1] * 3) / 3 is 0.10000000000000002: a mean computed so would widen the point by an ulp
    interval = mean_interval([0.1, 0.1, 0.1])
    assert interval == Interval(0.1, 0.1, 0.1, 3)
    assert interval.no_interval == "the seeds did not change it: no interval"
    assert interval.significant(1.0) is None
    assert interval.record() == {"mean": 0.1, "low": None, "high": None, "no_interval": "the seeds did not change it: no interval"}
