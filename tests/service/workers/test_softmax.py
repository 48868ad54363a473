"""The classifier worker's probabilities: Python floats for a few labels, numpy beyond."""

from __future__ import annotations

import math

import numpy as np
import pytest

from seqserve.service.workers.classifier import PYTHON_SOFTMAX_LABELS, probabilities, softmax


@pytest.mark.parametrize("labels", [1, 2, 5, PYTHON_SOFTMAX_LABELS, PYTHON_SOFTMAX_LABELS + 1, 300])
def test_probabilities_are_the_float64_softmax(labels: int) -> None:
    rng = np.random.default_rng(labels)
    for scale in (0.1, 10.0, 1000.0):  # 1000: exp would overflow without the max shift
        logits = (rng.standard_normal(labels) * scale).astype(np.float32)
        got = probabilities(logits)
        want = softmax(logits).tolist()
        assert all(type(p) is float for p in got)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)
        assert got.index(max(got)) == want.index(max(want))
        assert math.isclose(sum(got), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("logits", [[math.nan, 1, 2], [1, math.nan, 2], [math.inf, 1, 2],
                                    [math.inf, math.inf, 0]])
def test_non_finite_logits_give_what_numpy_gives(logits: list[float]) -> None:
    x = np.array(logits, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        want = softmax(x).tolist()
    got = probabilities(x)
    assert [math.isnan(p) for p in got] == [math.isnan(p) for p in want]
    assert [p for p in got if not math.isnan(p)] == [p for p in want if not math.isnan(p)]


def test_minus_infinity_is_probability_zero() -> None:
    assert probabilities(np.array([-np.inf, 0.0, 0.0], dtype=np.float32)) == [0.0, 0.5, 0.5]
