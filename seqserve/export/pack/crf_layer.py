"""A CRF tagger as its author wrote it -> the emission graph pack exports and the CRF scores
the bundle keeps (export/crf.py), for `seqserve.pack.tagger`.

Two ways of writing the CRF are read from the module's parameters (the module itself or
any submodule):

- the PyTorch BiLSTM-CRF tutorial's: a square `transitions` parameter over every tag,
  START and STOP included, indexed [next tag, previous tag], with the tags in a `tag_to_ix`
  dict (on the module or beside it) or the START / STOP names as the module file's
  `START_TAG` / `STOP_TAG`. The served labels are the other tags, in index order; the
  emission graph keeps their columns only; start scores are `transitions[tag, START]`, end
  scores `transitions[STOP, tag]`, as the tutorial's `_viterbi_decode` adds them;
- `torchcrf`'s `CRF` layer (and the many written like it): `transitions` [previous, next],
  `start_transitions` and `end_transitions`.

The emissions come from `emissions=` (a callable (ids (B, T), lengths (B,)) -> scores
(B, T, tags)) or the module's forward(ids, lengths); the tutorial's one-sentence
`_get_lstm_features(sentence)` is run over a padded batch as it computes
(`TutorialEmissions`: word_embeds, lstm within each row's length from `init_hidden()`,
hidden2tag). Before anything is written the module's own decoding (the tutorial's
`_viterbi_decode` per sentence, a torchcrf-style `decode`) is run on the pack's example
sentences and must give the tags and scores the bundle will: what does not is refused,
naming what differed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seqserve.export.crf import CRF, viterbi
from seqserve.models.errors import UserError
from seqserve.models.nn.masked_rnn import run_within_lengths

START_NAMES = ("start", "start_tag", "bos")
STOP_NAMES = ("stop", "stop_tag", "end", "eos")
"""A tag named like one of these (any case, with or without <>) is the tutorial's START or
STOP tag."""
EMISSIONS_FIX = ("give emissions=, a callable (ids (batch, seq), lengths (batch,)) -> emission "
                 "scores (batch, seq, tags), e.g. a method of the module that runs its "
                 "embedding, LSTM and linear layer over a padded batch")


@dataclass(frozen=True)
class FoundCRF:
    """A CRF read from a module: its scores over the served labels, and which emission
    columns those labels are."""

    crf: CRF
    keep: tuple[int, ...]
    """The emission columns that are labels, in order (the tutorial's: all but START and
    STOP)."""
    where: str
    """Which parameters it was read from (for messages)."""
    holder: nn.Module | None
    """The module that holds the parameters (its own decoding is the reference); None for
    scores given as `crf=`."""
    tutorial: bool
    """Laid out as the PyTorch tutorial's (START / STOP tags in `transitions`)."""


def _numpy(t: Any) -> np.ndarray:
    return np.asarray(t.detach().cpu().float().numpy() if isinstance(t, Tensor) else t)


def _tag_name(name: Any) -> str:
    return str(name).strip().strip("<>").lower()


def _start_stop(module: nn.Module, holder: nn.Module) -> tuple[int, int] | None:
    """The tutorial's START and STOP indices: from `tag_to_ix` (the holder's or the
    module's) by the names the file gives them (`START_TAG` / `STOP_TAG`) or the usual
    names."""
    tags = getattr(holder, "tag_to_ix", None) or getattr(module, "tag_to_ix", None)
    if not isinstance(tags, dict):
        return None
    file = sys.modules.get(type(holder).__module__)
    named = (getattr(file, "START_TAG", None), getattr(file, "STOP_TAG", None))
    if named[0] in tags and named[1] in tags:
        return int(tags[named[0]]), int(tags[named[1]])
    start = [i for k, i in tags.items() if _tag_name(k) in START_NAMES]
    stop = [i for k, i in tags.items() if _tag_name(k) in STOP_NAMES]
    if len(start) == 1 and len(stop) == 1:
        return int(start[0]), int(stop[0])
    return None


def find_crf(module: nn.Module) -> FoundCRF | None:
    """The CRF of `module` (module doc), None when it has no `transitions`; UserError for a
    `transitions` pack cannot read."""
    for name, sub in module.named_modules():
        trans = getattr(sub, "transitions", None)
        if not isinstance(trans, Tensor):
            continue
        where = f"{type(sub).__name__}{'.' + name if name else ''}.transitions"
        if trans.dim() != 2 or trans.shape[0] != trans.shape[1]:
            raise UserError(f"{where} is {tuple(trans.shape)}: a CRF's transition scores are "
                            "a square (tags, tags) matrix")
        t = _numpy(trans)
        start, end = (getattr(sub, k, None) for k in ("start_transitions", "end_transitions"))
        if isinstance(start, Tensor) and isinstance(end, Tensor):
            crf = _checked(where, t, _numpy(start), _numpy(end))
            return FoundCRF(crf, tuple(range(t.shape[0])), where, sub, tutorial=False)
        ends = _start_stop(module, sub)
        if ends is None:
            raise UserError(
                f"{where} has no start_transitions / end_transitions beside it and no "
                "tag_to_ix with START and STOP tags (the PyTorch tutorial's '<START>' and "
                "'<STOP>'): pack cannot tell where a labelling starts and ends. Give crf= "
                "{'transitions': [previous, next] scores, 'start': ..., 'end': ...}")
        first, stop = ends
        keep = tuple(i for i in range(t.shape[0]) if i not in (first, stop))
        index = np.array(keep)
        crf = _checked(where, t[np.ix_(index, index)].T, t[index, first], t[stop, index])
        return FoundCRF(crf, keep, f"{where} (START {first}, STOP {stop})", sub,
                        tutorial=True)
    return None


def _checked(where: str, transitions: np.ndarray, start: np.ndarray, end: np.ndarray) -> CRF:
    try:
        return CRF.from_arrays(transitions, start, end)
    except ValueError as exc:
        raise UserError(f"{where}: {exc}") from exc


class TutorialEmissions(nn.Module):
    """The tutorial's `_get_lstm_features(sentence)` over a padded batch: word_embeds, the
    LSTM run within each row's length from the module's `init_hidden()` state, hidden2tag;
    (ids (B, T), lengths (B,)) -> scores (B, T, tags)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.h0: Tensor | None = None
        self.c0: Tensor | None = None
        user: Any = module  # the user's own attributes
        if hasattr(user, "init_hidden"):
            first, again = user.init_hidden(), user.init_hidden()
            pairs = first if isinstance(first, tuple | list) else (first,)
            if any(not torch.equal(a, b) for a, b in zip(
                    pairs, again if isinstance(again, tuple | list) else (again,),
                    strict=True)):
                raise UserError(
                    f"{type(module).__name__}.init_hidden() returns a different state at "
                    "each call (torch.randn, as the PyTorch tutorial writes it): the module's "
                    "own tags then change from call to call, and no bundle can equal them. "
                    "Start from zeros: torch.zeros(...) in init_hidden")
            if any(bool(p.any()) for p in pairs):
                self.h0 = pairs[0].detach()
                self.c0 = pairs[1].detach() if len(pairs) > 1 else None

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        m: Any = self.module  # the user's own attributes
        x = m.word_embeds(ids)  # (B, T, E)
        hx: Any = None
        if self.h0 is not None:
            batch = ids.shape[0]
            h = self.h0.expand(-1, batch, -1).contiguous()
            hx = h if self.c0 is None else (h, self.c0.expand(-1, batch, -1).contiguous())
        out, _, _ = run_within_lengths(m.lstm, x, lengths, hx, batch_first=True)
        return m.hidden2tag(out)  # (B, T, tags)


def is_tutorial(module: nn.Module) -> bool:
    """Whether `module` computes its emissions as the tutorial's `_get_lstm_features`
    (word_embeds, lstm, hidden2tag) does."""
    return (hasattr(module, "_get_lstm_features")
            and isinstance(getattr(module, "word_embeds", None), nn.Embedding)
            and isinstance(getattr(module, "lstm", None), nn.RNNBase)
            and isinstance(getattr(module, "hidden2tag", None), nn.Linear))


class Emissions(nn.Module):
    """(ids, lengths) -> emission scores (B, T, labels) from the user's callable (its owner
    module registered, for the export), only the columns `keep` when given."""

    def __init__(self, emissions: Callable[..., Any], keep: tuple[int, ...] | None,
                 owner: nn.Module) -> None:
        super().__init__()
        self.owner = owner
        self._emissions = emissions
        self.register_buffer("keep", None if keep is None else torch.tensor(keep))

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        out = self._emissions(ids, lengths)
        scores = out[0] if isinstance(out, tuple | list) else out
        keep = self.keep
        return scores if keep is None else scores.index_select(-1, keep)


def crf_emissions(module: nn.Module, found: FoundCRF,
                  emissions: Callable[..., Any] | None, ids: Tensor,
                  lengths: Tensor) -> Emissions:
    """The module that gives the served labels' emission scores (module doc), checked on
    (ids, lengths) for its shape."""
    source: Callable[..., Any]
    if emissions is not None:
        source = emissions
    elif found.tutorial and is_tutorial(module):
        source = TutorialEmissions(module)
    else:
        source = module
    columns = len(found.keep) + 2 if found.tutorial else found.crf.labels
    wrap = Emissions(source, found.keep if found.tutorial else None, module).eval()
    with torch.no_grad():
        try:
            raw = source(ids, lengths)
        except Exception as exc:  # the module's own error on a contract-shaped batch
            raise UserError(f"{_name(source)}(ids {tuple(ids.shape)}, lengths "
                            f"{tuple(lengths.shape)}) failed ({type(exc).__name__}: {exc}); "
                            f"a CRF tagger's forward often decodes or returns its loss: "
                            f"{EMISSIONS_FIX}") from exc
    scores = raw[0] if isinstance(raw, tuple | list) else raw
    if (not isinstance(scores, Tensor) or scores.dim() != 3
            or tuple(scores.shape) != (*ids.shape, columns)):
        got = tuple(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise UserError(f"{_name(source)}(ids {tuple(ids.shape)}, lengths) gave {got}, not "
                        f"emission scores {(*ids.shape, columns)} (one per tag of "
                        f"{found.where}): {EMISSIONS_FIX}")
    return wrap


def _name(source: Any) -> str:
    if isinstance(source, TutorialEmissions):
        return f"{type(source.module).__name__}'s word_embeds -> lstm -> hidden2tag"
    return getattr(source, "__qualname__", type(source).__name__)


def check_own_decoding(module: nn.Module, found: FoundCRF, wrap: Emissions, ids: Tensor,
                       lengths: Tensor) -> int:
    """The module's own decoding (module doc) against the bundle's on (ids, lengths):
    UserError naming the first sentence that differs; returns how many were compared (0:
    the module decodes in no way pack knows)."""
    with torch.no_grad():
        scores = wrap(ids, lengths)  # (B, T, labels)
    ours, our_scores = viterbi(_numpy(scores), lengths.numpy(), found.crf)
    holder: Any = found.holder  # the user's own methods
    if holder is None:
        return 0
    if found.tutorial and hasattr(holder, "_viterbi_decode"):
        for i, n in enumerate(lengths.tolist()):
            with torch.no_grad():
                feats = (holder._get_lstm_features(ids[i, :n])
                         if hasattr(holder, "_get_lstm_features") else None)
                own_feats = _numpy(feats) if feats is not None else None
                if own_feats is not None:
                    got = _numpy(scores[i, :n])
                    kept = own_feats[:, list(found.keep)]
                    if not np.allclose(got, kept, rtol=1e-4, atol=1e-4):
                        raise UserError(
                            f"{type(holder).__name__}._get_lstm_features(sentence) differs "
                            f"from the batched emissions pack exports by "
                            f"{float(np.abs(got - kept).max()):.3g} on a sentence of {n} "
                            f"tokens: {EMISSIONS_FIX}")
                score, path = holder._viterbi_decode(feats)
            _same(found, [found.keep.index(int(p)) if int(p) in found.keep else -1
                          for p in path], float(score), ours[i, :n], our_scores[i], n)
        return len(lengths)
    decode = getattr(holder, "decode", None)
    if found.tutorial or not callable(decode):
        return 0
    batch_first = bool(getattr(holder, "batch_first", False))
    mask = torch.arange(ids.shape[1])[None] < lengths[:, None]  # (B, T)
    em = scores if batch_first else scores.transpose(0, 1)
    with torch.no_grad():
        paths = decode(em, mask if batch_first else mask.transpose(0, 1))
    for i, n in enumerate(lengths.tolist()):
        _same(found, [int(p) for p in paths[i]], None, ours[i, :n], our_scores[i], n)
    return len(lengths)


def _same(found: FoundCRF, own: list[int], own_score: float | None, ours: np.ndarray,
          our_score: float, n: int) -> None:
    if own != ours.tolist() or (own_score is not None
                                and not np.isclose(own_score, our_score, rtol=1e-4, atol=1e-3)):
        score = "" if own_score is None else f" (score {own_score:.6g} vs {our_score:.6g})"
        raise UserError(f"the module's own decoding of a sentence of {n} tokens is {own}, the "
                        f"bundle's would be {ours.tolist()}{score}: the CRF read from "
                        f"{found.where} is not the one it decodes with. Give crf= its "
                        "{'transitions': [previous, next] scores, 'start': ..., 'end': ...}")


def tagger_parts(module: nn.Module, crf: Any, emissions: Callable[..., Any] | None,
                 ids: Tensor, lengths: Tensor) -> tuple[nn.Module, FoundCRF | None, int]:
    """What `seqserve.pack.tagger` exports and keeps: the module giving the per-token
    scores, the CRF (None: none; `crf` None finds the module's own, False leaves it out, a
    module is searched, anything else is read by `parse_crf`) and how many example sentences
    the module's own decoding was compared on (`check_own_decoding`)."""
    from seqserve.export.pack.bundle import parse_crf

    if crf is None or isinstance(crf, nn.Module):
        found = find_crf(module if crf is None else crf)
        if found is None and crf is not None:
            raise UserError(f"crf={type(crf).__name__}: it has no transitions parameter")
    elif crf is False:
        found = None
    else:
        given = parse_crf(crf)
        found = FoundCRF(given, tuple(range(given.labels)), "crf=", None, tutorial=False)
    if found is None:
        source = module if emissions is None else Emissions(emissions, None, module).eval()
        return source, None, 0
    wrap = crf_emissions(module, found, emissions, ids, lengths)
    return wrap, found, check_own_decoding(module, found, wrap, ids, lengths)
