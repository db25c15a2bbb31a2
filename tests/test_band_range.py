"""The measured range beside an error band: which side of the prediction a regime's runs fell on
(the half-width alone does not say)."""

from __future__ import annotations

import pytest

from autopar.cost import published, regime as rg


def test_measured_range_is_the_middle_of_measured_over_predicted():
    # residual e = (pred - meas) / meas -> measured / predicted = 1 / (1 + e)
    residuals = [-0.5, -0.2, -0.1, 0.0, 0.25]        # ratios 2.0, 1.25, 1.111, 1.0, 0.8
    low, high = rg.measured_range(residuals)
    # nearest rank of 5: the 15.9% quantile is the 1st smallest, the 84.1% the 5th
    assert (low, high) == (0.8, 2.0)
    assert rg.measured_range([-0.2] * 10) == (1.25, 1.25)
    with pytest.raises(ValueError):
        rg.measured_range([])


def test_every_banded_cell_has_its_range_and_a_validated_band_states_it():
    assert set(published.MEASURED_RANGES) == set(published.BANDS)
    for cell, (low, high) in published.MEASURED_RANGES.items():
        assert 0 < low <= high, cell
    key = next(k for k, (_, _, n, s) in published.BANDS.items() if rg.validates(n, s)
               and k[0] != rg.ANY and rg.ANY not in k)
    band = rg.band_for(rg.Regime(*key))
    low, high = published.MEASURED_RANGES[key]
    assert band.measured_range == (low, high)
    assert f"took {low:.2f}-{high:.2f} times the predicted step time" in band.describe()


def test_an_unvalidated_band_states_no_range():
    band = rg.band_for(rg.Regime("torch", "fp16", "volta", "data", "dense", "1 node", "<3B"))
    assert band.measured_range is None and "times the predicted" not in band.describe()
