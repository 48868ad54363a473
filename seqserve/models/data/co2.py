"""The weekly Mauna Loa CO2 series (statsmodels' `statsmodels.datasets.co2`), split in time.

2,284 weeks (Saturdays, 1958-03-29 .. 2001-12-29) of atmospheric CO2 in ppm, 59 of them
missing (the longest gap: 18 weeks, in 1964). Gaps are filled by linear interpolation in time
between the observed weeks on either side (the index is evenly spaced, so linear in the week
number); a gap at either end would take the nearest observed value (the shipped series has
none). `observed` marks the weeks that were measured: metrics score observed targets only.

Splits are contiguous spans, never shuffled across time: test = the last `test_weeks`
(default 104, 2000-01-08 .. 2001-12-29), valid = the `valid_weeks` before it, train = the rest.
docs/data.md has the figures. Torch-free; statsmodels is imported when the series is loaded
(it ships the data offline: no download).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seqserve.models.errors import DataError

SPLITS = ("train", "valid", "test")
TEST_WEEKS = 104
VALID_WEEKS = 104
SEASON = 52
"""Weeks per seasonal cycle (the seasonal-naive baseline's lag)."""


@dataclass(frozen=True)
class SeriesSplit:
    """One univariate series and its contiguous split spans."""

    name: str
    dates: list[str]
    """ISO date of each step."""
    values: np.ndarray = field(repr=False)
    """(N,) float64, gaps interpolated."""
    observed: np.ndarray = field(repr=False)
    """(N,) bool: the step was measured (not interpolated)."""
    spans: dict[str, tuple[int, int]]
    """split -> [start, stop) step indices; train, valid, test in order, covering 0..N."""
    unit: str = "ppm"

    def span(self, split: str) -> np.ndarray:
        start, stop = self.spans[split]
        return self.values[start:stop]

    def counts(self) -> dict[str, int]:
        return {k: b - a for k, (a, b) in self.spans.items()}

    def summary(self) -> dict[str, object]:
        """JSON-ready description for config.json and manifests."""
        return {"name": self.name, "unit": self.unit, "steps": len(self.values),
                "interpolated": int((~self.observed).sum()),
                "spans": {k: {"start": self.dates[a], "end": self.dates[b - 1], "steps": b - a}
                          for k, (a, b) in self.spans.items()}}


def interpolate_gaps(values: np.ndarray) -> np.ndarray:
    """NaNs filled linearly between the observed neighbours (nearest value at the ends)."""
    values = np.asarray(values, dtype=np.float64)
    seen = np.isfinite(values)
    if not seen.any():
        raise DataError("the series has no observed value")
    steps = np.arange(len(values))
    return np.interp(steps, steps[seen], values[seen])


def split_series(name: str, dates: list[str], raw: np.ndarray, test_weeks: int = TEST_WEEKS,
                 valid_weeks: int = VALID_WEEKS, unit: str = "ppm") -> SeriesSplit:
    """Interpolate `raw` and cut it into train | valid | test spans (the last ones last)."""
    raw = np.asarray(raw, dtype=np.float64)
    n = len(raw)
    if len(dates) != n:
        raise DataError(f"{len(dates)} dates for {n} values")
    if test_weeks < 1 or valid_weeks < 1 or n - test_weeks - valid_weeks < 2 * SEASON:
        raise DataError(f"a series of {n} steps cannot hold valid={valid_weeks} and "
                        f"test={test_weeks} steps and two seasons of training")
    b = n - test_weeks
    a = b - valid_weeks
    return SeriesSplit(name=name, dates=list(dates), values=interpolate_gaps(raw),
                       observed=np.isfinite(raw),
                       spans={"train": (0, a), "valid": (a, b), "test": (b, n)}, unit=unit)


def load_co2(test_weeks: int = TEST_WEEKS, valid_weeks: int = VALID_WEEKS) -> SeriesSplit:
    """statsmodels' weekly Mauna Loa CO2 series, interpolated and split (module doc)."""
    try:
        from statsmodels.datasets import co2
    except ImportError as exc:  # pragma: no cover - statsmodels is in the train extra
        raise DataError("the CO2 series needs statsmodels: pip install 'seqserve[train]'"
                        ) from exc
    frame = co2.load_pandas().data
    dates = [d.strftime("%Y-%m-%d") for d in frame.index]
    return split_series("mauna-loa-co2-weekly", dates, frame["co2"].to_numpy(np.float64),
                        test_weeks, valid_weeks)
