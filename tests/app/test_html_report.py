"""Report charts: a CDF drawn from a subset of its points still lies exactly on the CDF."""

from __future__ import annotations

import numpy as np

from app.html_report import cdf_points


def test_cdf_points_keep_few_values_and_thin_many_onto_the_cdf() -> None:
    few = np.array([0.1, 0.2, 0.2, 0.5])
    x, y = cdf_points(few)
    assert x.tolist() == few.tolist() and y.tolist() == [0.25, 0.5, 0.75, 1.0]
    many = np.sort(np.random.default_rng(0).lognormal(size=10_007))
    x, y = cdf_points(many, most=500)
    assert len(x) == 500 and x[0] == many[0] and x[-1] == many[-1] and y[-1] == 1.0
    # Each point is a point of the empirical CDF: the share of values at or below it.
    assert np.array_equal(y, np.searchsorted(many, x, side="right") / len(many))
    assert np.all(np.diff(x) > 0)  # evenly spread ranks, none twice
