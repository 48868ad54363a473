"""Scores per surface form: test rows that carry a `"form"` (the built-in number datasets,
models/data/surface.py) are also scored per form, so a variation that breaks the model shows
on its own line instead of vanishing in the average.

Translators are scored on what a user of the server gets: beam search with the server's
default options (beam 5, no length penalty), not teacher forcing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from seqserve.models.train.metrics import translation_metrics

SERVER_BEAM_SIZE = 5
"""The server's default beam size (service/schemas_translate.py TranslateOptions)."""
SERVER_LENGTH_PENALTY = 0.0
"""The server's default GNMT length penalty alpha."""
SEARCH_NAME = "beam 5, length penalty 0 (the server default)"
"""How test translations are decoded, as written into test_metrics.json ("search")."""


def _groups(forms: Sequence[str]) -> dict[str, list[int]]:
    """Form -> row indices; rows without a form are left out."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, form in enumerate(forms):
        if form:
            groups[form].append(i)
    return dict(sorted(groups.items()))


def translation_forms(forms: Sequence[str], hypotheses: Sequence[str],
                      references: Sequence[str]) -> dict[str, dict[str, float]]:
    """{form: {"examples", "exact_match", "chrf"}} over the rows of each form."""
    out: dict[str, dict[str, float]] = {}
    for form, rows in _groups(forms).items():
        scores = translation_metrics([hypotheses[i] for i in rows], [references[i] for i in rows])
        out[form] = {"examples": len(rows), "exact_match": scores["exact_match"],
                     "chrf": scores["chrf"]}
    return out


def tagging_forms(forms: Sequence[str],
                  hits: Sequence[tuple[int, int]]) -> dict[str, dict[str, float]]:
    """{form: {"examples", "words", "token_accuracy"}} from per-row (correct, words)."""
    out: dict[str, dict[str, float]] = {}
    for form, rows in _groups(forms).items():
        correct = sum(hits[i][0] for i in rows)
        words = sum(hits[i][1] for i in rows)
        out[form] = {"examples": len(rows), "words": words,
                     "token_accuracy": correct / max(1, words)}
    return out


def worst(forms: dict[str, dict[str, Any]], key: str) -> tuple[str, float]:
    """(form, score) of the lowest `key` across forms."""
    form = min(forms, key=lambda f: forms[f][key])
    return form, float(forms[form][key])


def format_table(forms: dict[str, dict[str, Any]]) -> list[str]:
    """The per-form scores as aligned text lines (header first), percentages for rates."""
    if not forms:
        return []
    keys = [k for k in next(iter(forms.values())) if k not in ("examples", "words")]
    lines = [f"{'form':<12} {'rows':>5} " + " ".join(f"{k:>14}" for k in keys)]
    for form, scores in forms.items():
        cells = [f"{100 * scores[k]:13.2f}%" if k != "chrf" else f"{scores[k]:14.2f}"
                 for k in keys]
        lines.append(f"{form:<12} {int(scores['examples']):>5} " + " ".join(cells))
    return lines
