"""The translate options schema: every limit and combination is declared once, here."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from seqserve.service.api.translate import TranslateOptions
from seqserve.service.core.errors import BadRequest
from seqserve.service.scheduling.search import MAX_BEAM_SIZE
from seqserve.service.web.settings import Settings


@pytest.mark.parametrize("bad", [
    {"beam_size": 0}, {"beam_size": 2, "n_best": 3}, {"length_penalty": -1.0},
    {"coverage_penalty": -0.1}, {"beam_size": 3, "temperature": 0.5}, {"top_p": 0.0},
    {"beam_size": 1, "top_k": 0}, {"max_length": 0}, {"max_length_ratio": -1.0},
    {"min_length": -1}, {"beam_size": 1, "temperature": 0.0},
    {"beam_size": MAX_BEAM_SIZE + 1}, {"n_best": 2, "temperature": 0.7},
    {"beam_size": 2.5}, {"top_k": 12.5}, {"top_k": "5"}, {"beam_size": True},
    {"seed": 2**53},
])
def test_bad_options_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TranslateOptions(**bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="bad translate parameters"):
        TranslateOptions.from_parameters(bad)


def test_whole_numbers_are_integers_and_min_length_may_reach_the_cap() -> None:
    """JSON Schema's `integer` includes 2.0, so the server takes it; min_length at or over
    max_length is allowed (no EOS: the output ends at the cap, as with any other cap)."""
    options = TranslateOptions.model_validate({"beam_size": 2.0, "top_k": None, "n_best": 2e0})
    assert (options.beam_size, options.n_best) == (2, 2)
    assert isinstance(options.beam_size, int)
    assert TranslateOptions(min_length=5, max_length=5).search_options().min_length == 5


def test_defaults_are_documented_not_rewritten() -> None:
    assert TranslateOptions().search_options().beam_size == 5
    sampled = TranslateOptions(temperature=0.7)
    assert sampled.beam_size is None and sampled.search_options().beam_size == 1
    assert TranslateOptions(beam_size=1, top_k=5).search_options().top_k == 5


def test_settings_keep_room_for_the_largest_beam() -> None:
    with pytest.raises(ValidationError, match="max_live_hypotheses"):
        Settings(max_live_hypotheses=MAX_BEAM_SIZE - 1)
