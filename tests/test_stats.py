"""tasim.stats: Student t quantiles and intervals, against published table values."""

from __future__ import annotations

import pytest

from tasim.stats import mean_interval, paired_ratio, t_cdf, t_quantile


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
    assert paired_ratio([1.0], [0.0]) is None
    with pytest.raises(ValueError, match="2 values against 1 baseline values"):
        paired_ratio([1.0, 2.0], [1.0])
