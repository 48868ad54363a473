"""Wrap a user's PyTorch module (eager or TorchScript) into the served contract, in torch.

The same wrapping as `onnx_compose`, written as modules so that they can be exported
(ONNX with dynamic axes, TorchScript by tracing) and run eagerly as the reference:

- `ClassifierWrap`: forward(ids, lengths) -> logits, or (logits, attention);
- `TaggerWrap`: forward(ids, lengths) -> logits (B, T, C) -> log_probs (a CRF tagger's
  emission scores as they are), zeros past length;
- `EncoderWrap`: encode(ids, lengths) -> (memory, state...) -> memory zeroed past length,
  src_mask, the state tensors flattened into one (B, state_dim);
- `StepWrap`: step(prev_ids, state..., memory rows, mask rows) -> (logits, new state...,
  [attention]) -> memory gathered by memory_index, log-softmax + top-k, flat new state;
- `SeriesWrap` / `StatefulSeriesWrap`: a feature-sequence module(features, lengths[,
  state...]) -> outputs (B, k) or (B, T, k) zeroed past length[, the new state tensors
  flattened into one (B, state_dim)];
- `LMPrefillWrap` / `LMPrefillRows` / `LMStepWrap`: a language model's forward(input,
  hidden) -> (logits, hidden) over the prompts from a zero state (exported; its ONNX
  recurrent nodes then read the lengths), each prompt alone (the eager reference), and on
  one token per row.

A state is whatever the user's encoder returns after memory: a tensor (layers, batch,
hidden) or (batch, hidden), or a tuple of them such as an LSTM's (h, c); `StateTree` records
the nesting so the step gets its state back in the same shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.export.graphs import example_lengths
from seqserve.export.pack.onnx_compose import StateLayout
from seqserve.models.errors import BundleError


def example_ids(vocab: int, batch: int = 3, seq: int = 11) -> tuple[Tensor, Tensor]:
    """Token ids (B, T) in [1, vocab) (padded with 0) and their distinct lengths (B,): the
    inputs a wrapper is traced and checked with."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(min(1, vocab - 1), vocab, (batch, seq), generator=gen)  # (B, T)
    lengths = example_lengths(batch, seq)  # (B,)
    return ids.masked_fill(torch.arange(seq)[None] >= lengths[:, None], 0), lengths


def example_series(features: int, batch: int = 3, steps: int = 11) -> tuple[Tensor, Tensor]:
    """Random float series (B, T, D) and their distinct lengths (B,)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, steps, features, generator=gen)  # (B, T, D)
    return x, example_lengths(batch, steps)


def _first(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple | list) else out


def length_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B, T) bool from lengths, built from the input (no device or size constants)."""
    positions = torch.ones_like(lengths[:1]).expand(max_len).cumsum(0) - 1  # (T,)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


class ClassifierWrap(nn.Module):
    """(ids, lengths) -> (logits,) or (logits, attention)."""

    def __init__(self, module: nn.Module, attention: bool) -> None:
        super().__init__()
        self.module = module
        self.attention = attention

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, ...]:
        out = self.module(input_ids, lengths)
        logits = _first(out).float()
        if not self.attention:
            return (logits,)
        att = out[1].float() * length_mask(lengths, input_ids.shape[1]).float()
        return logits, att


class TaggerWrap(nn.Module):
    """(ids, lengths) -> (log_probs,) with zeros past each row's length; with `normalize`
    False (a CRF tagger's emission scores, which the CRF takes as they are) the scores
    unchanged."""

    def __init__(self, module: nn.Module, normalize: bool = True) -> None:
        super().__init__()
        self.module = module
        self.normalize = normalize

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor]:
        logits = _first(self.module(input_ids, lengths)).float()
        lp = F.log_softmax(logits, dim=-1) if self.normalize else logits
        mask = length_mask(lengths, input_ids.shape[1]).unsqueeze(-1)
        return (torch.where(mask, lp, torch.zeros_like(lp)),)


@dataclass(frozen=True)
class StateTree:
    """The nesting of the user's state: each top-level item a tensor or a tuple of them."""

    shape: tuple[int, ...]
    """Per top-level state item: 0 for a tensor, n for a tuple of n tensors."""
    layouts: tuple[StateLayout, ...]
    """Per leaf tensor, in order."""

    def leaves(self, items: tuple[Any, ...]) -> list[Tensor]:
        out: list[Tensor] = []
        for n, item in zip(self.shape, items, strict=True):
            out += list(item) if n else [item]
        return out

    def build(self, leaves: list[Tensor]) -> tuple[Any, ...]:
        items: list[Any] = []
        i = 0
        for n in self.shape:
            if n:
                items.append(tuple(leaves[i:i + n]))
                i += n
            else:
                items.append(leaves[i])
                i += 1
        return tuple(items)

    def flatten(self, leaves: list[Tensor]) -> Tensor:
        parts = []
        for t, lay in zip(leaves, self.layouts, strict=True):
            if lay.layers:
                t = t.transpose(0, 1).reshape(t.shape[1], lay.width)  # (B, L*H)
            parts.append(t.float())
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def unflatten(self, state: Tensor) -> list[Tensor]:
        leaves, offset = [], 0
        for lay in self.layouts:
            part = state[:, offset:offset + lay.width]
            offset += lay.width
            if lay.layers:
                part = part.reshape(state.shape[0], lay.layers, lay.hidden).transpose(0, 1)
            leaves.append(part.contiguous())
        return leaves


def state_tree(encode: Callable[..., Any], example: tuple[Tensor, Tensor]) -> StateTree:
    """Run `encode` on two batch sizes to find each state tensor's batch axis."""
    ids, lengths = example
    with torch.no_grad():
        a = encode(ids, lengths)
        b = encode(ids[:2], lengths[:2])
    if not isinstance(a, tuple | list) or len(a) < 2:
        raise BundleError("encode(ids, lengths) must return (memory, state...): the memory "
                          "(batch, src_len, dim) and the decoder's initial state")
    return _tree(a[1:], b[1:], ids.shape[0])


def _tree(items_a: Sequence[Any], items_b: Sequence[Any], batch: int) -> StateTree:
    """The tree of the state items a module returned at batch size `batch` (`items_a`) and at
    batch size 2 (`items_b`): each item a tensor (nest 0) or a tuple / list of them (nest: how
    many), each tensor's layout from where the two batch sizes differ."""
    nest: list[int] = []
    layouts: list[StateLayout] = []
    for item_a, item_b in zip(items_a, items_b, strict=True):
        group_a = list(item_a) if isinstance(item_a, tuple | list) else [item_a]
        group_b = list(item_b) if isinstance(item_b, tuple | list) else [item_b]
        nest.append(len(group_a) if isinstance(item_a, tuple | list) else 0)
        layouts += [_layout(ta, tb, batch) for ta, tb in zip(group_a, group_b, strict=True)]
    return StateTree(tuple(nest), tuple(layouts))


def _layout(a: Tensor, b: Tensor, batch: int) -> StateLayout:
    if a.dim() == 3 and a.shape[1] == batch and b.shape[1] == 2:
        return StateLayout(int(a.shape[0]), int(a.shape[2]))
    if a.dim() == 2 and a.shape[0] == batch and b.shape[0] == 2:
        return StateLayout(0, int(a.shape[1]))
    raise BundleError(f"a state tensor of shape {tuple(a.shape)}: expected (layers, batch, "
                      "hidden) or (batch, hidden)")


class EncoderWrap(nn.Module):
    """(src_ids, src_lengths) -> (memory zeroed past length, src_mask, flat state)."""

    def __init__(self, encode: Callable[..., Any], tree: StateTree,
                 owner: nn.Module | None = None) -> None:
        super().__init__()
        self.owner = owner if owner is not None else encode  # registers the parameters
        self._encode = encode
        self.tree = tree

    def forward(self, src_ids: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = self._encode(src_ids, src_lengths)
        mask = length_mask(src_lengths, src_ids.shape[1])  # (B, S)
        memory = out[0].float() * mask.unsqueeze(-1).float()
        return memory, mask, self.tree.flatten(self.tree.leaves(tuple(out[1:])))


class StepWrap(nn.Module):
    """The contract's decoder step around the user's step (see module doc)."""

    def __init__(self, step: Callable[..., Any], tree: StateTree, attention: bool,
                 owner: nn.Module | None = None) -> None:
        super().__init__()
        self.owner = owner if owner is not None else step
        self._step = step
        self.tree = tree
        self.attention = attention

    def forward(self, prev_ids: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor,
                memory_index: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        mem = memory.index_select(0, memory_index)  # (R, S, D)
        mask = src_mask.index_select(0, memory_index)  # (R, S)
        items = self.tree.build(self.tree.unflatten(state))
        out = self._step(prev_ids, *items, mem, mask)
        n = len(self.tree.shape)
        logits = out[0].float()
        new_state = self.tree.flatten(self.tree.leaves(tuple(out[1:1 + n])))
        lp = F.log_softmax(logits, dim=-1)
        top_lp, top_ids = torch.topk(lp, k.reshape(()), dim=-1)  # type: ignore[call-overload,arg-type]
        att = out[1 + n].float() if self.attention else torch.zeros_like(mask, dtype=lp.dtype)
        return new_state, top_lp, top_ids, att


def step_has_attention(step: Callable[..., Any], tree: StateTree, example: tuple[Any, ...]
                       ) -> bool:
    """Whether the user's step returns an attention after its new state."""
    with torch.no_grad():
        out = step(*example)
    n = len(tree.shape)
    if not isinstance(out, tuple | list) or len(out) not in (n + 1, n + 2):
        raise BundleError(f"step(prev_ids, state..., memory, mask) returned {type(out).__name__}"
                          f" of {len(out) if isinstance(out, tuple | list) else 1} items: "
                          f"expected (logits, {n} new state item(s)[, attention])")
    return len(out) == n + 2


class SeriesWrap(nn.Module):
    """(features, lengths) -> (outputs,): float32; a tagger's zeroed past each row's length."""

    def __init__(self, module: nn.Module, tagger: bool) -> None:
        super().__init__()
        self.module = module
        self.tagger = tagger

    def _outputs(self, out: Tensor, features: Tensor, lengths: Tensor) -> Tensor:
        out = out.float()
        if not self.tagger:
            return out
        mask = length_mask(lengths, features.shape[1]).unsqueeze(-1)  # (B, T, 1)
        return torch.where(mask, out, torch.zeros_like(out))

    def forward(self, features: Tensor, lengths: Tensor) -> tuple[Tensor]:
        return (self._outputs(_first(self.module(features, lengths)), features, lengths),)


class StatefulSeriesWrap(SeriesWrap):
    """(features, lengths, state (B, S)) -> (outputs, new_state (B, S)): the flat state is
    split into the module's own state items (`StateTree`) and its new ones flattened again."""

    def __init__(self, module: nn.Module, tagger: bool, tree: StateTree) -> None:
        super().__init__(module, tagger)
        self.tree = tree

    def forward(self, features: Tensor, lengths: Tensor,  # type: ignore[override]
                state: Tensor) -> tuple[Tensor, Tensor]:
        items = self.tree.build(self.tree.unflatten(state))
        out = self.module(features, lengths, *items)
        n = len(self.tree.shape)
        new_state = self.tree.flatten(self.tree.leaves(tuple(out[1:1 + n])))
        return self._outputs(out[0], features, lengths), new_state


def _shapes(items: Any) -> list[Any]:
    return [[tuple(t.shape) for t in x] if isinstance(x, tuple | list) else tuple(x.shape)
            for x in items]


def _two(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The same state shape for a batch of two (batch: axis 1 of 3, else axis 0)."""
    return (shape[0], 2, *shape[2:]) if len(shape) == 3 else (2, *shape[1:])


def _zeros(shapes: list[Any]) -> tuple[Any, ...]:
    return tuple(tuple(torch.zeros(s) for s in x) if isinstance(x, list) else torch.zeros(x)
                 for x in shapes)


def _candidates(module: nn.Module, batch: int, count: int) -> list[list[Any]]:
    """State shapes the module's recurrent layers suggest, for `count` state arguments."""
    out: list[list[Any]] = []
    for m in module.modules():
        if not isinstance(m, nn.RNNBase):
            continue
        layers = m.num_layers * (2 if m.bidirectional else 1)
        hidden = m.hidden_size
        h = getattr(m, "proj_size", 0) or hidden
        if isinstance(m, nn.LSTM):
            if count == 1:
                out += [[[(layers, batch, h), (layers, batch, hidden)]],
                        [(batch, layers * (h + hidden))]]
            elif count == 2:
                out += [[(layers, batch, h), (layers, batch, hidden)],
                        [(batch, layers * h), (batch, layers * hidden)]]
        elif count == 1:
            out += [[(layers, batch, hidden)], [(batch, layers * hidden)]]
    return out


def series_state_tree(module: nn.Module, example: tuple[Tensor, Tensor], count: int
                      ) -> StateTree:
    """The nesting and layout of a stateful module's state: found by calling it with None
    (a module that starts from zeros itself), else with zeros of the shapes its recurrent
    layers suggest, on two batch sizes; its returned new state must have the same shapes."""
    x, lengths = example
    batch = x.shape[0]
    tried: list[str] = []
    with torch.no_grad():
        guesses: list[list[Any]] = []
        try:
            out = module(x, lengths, *([None] * count))
            if isinstance(out, tuple | list) and len(out) == 1 + count:
                guesses.append(_shapes(out[1:]))
        except Exception as exc:  # the module needs a real state: try the shapes
            tried.append(f"None ({type(exc).__name__})")
        guesses += _candidates(module, batch, count)
        for shapes in guesses:
            try:
                a = module(x, lengths, *_zeros(shapes))
                small = [[_two(s) for s in item] if isinstance(item, list) else _two(item)
                         for item in shapes]
                b = module(x[:2], lengths[:2], *_zeros(small))
            except Exception as exc:  # this guess does not fit
                tried.append(f"{shapes} ({type(exc).__name__})")
                continue
            if not (isinstance(a, tuple | list) and len(a) == 1 + count
                    and _shapes(a[1:]) == shapes):
                got = _shapes(a[1:]) if isinstance(a, tuple | list) else "one tensor"
                tried.append(f"{shapes} (returned {got})")
                continue
            return _tree(a[1:], b[1:], batch)
    raise BundleError(
        f"forward(features, lengths, {count} state argument(s)): could not find the state it "
        f"takes (tried {'; '.join(tried) or 'nothing: no nn.LSTM/GRU/RNN inside'}). A stateful "
        "module takes its state as (layers, batch, hidden) or (batch, width) tensors (an LSTM's "
        "(h, c) as a tuple or two arguments) and returns the new state in the same shapes "
        "after its outputs")


# -- language models ------------------------------------------------------------------------

def _lm_input(ids: Tensor, time_major: bool) -> Tensor:
    return ids.transpose(0, 1) if time_major else ids


def _lm_logits(out: Any, x: Tensor, time_major: bool) -> Tensor:
    """The module's output as (B, T, V): from (T, B, V), (B, T, V) or flattened (T*B, V)."""
    logits = _first(out)
    if logits.dim() == 2:
        logits = logits.reshape(x.shape[0], x.shape[1], -1)
    return (logits.transpose(0, 1) if time_major else logits).float()


class _LMWrap(nn.Module):
    """A language model `module(input, hidden)` with the tree of its state tensors and its
    token layout: what the prefill and step wrappers share."""

    def __init__(self, module: nn.Module, tree: StateTree, time_major: bool) -> None:
        super().__init__()
        self.module = module
        self.tree = tree
        self.time_major = time_major

    def _run(self, x: Tensor, state: Tensor) -> tuple[Any, Tensor]:
        """(the module's output on `x` from the flat `state` (R, S), its new state (R, S))."""
        out = self.module(x, *self.tree.build(self.tree.unflatten(state)))
        n = len(self.tree.shape)
        return out, self.tree.flatten(self.tree.leaves(tuple(out[1:1 + n])))


class LMPrefillWrap(_LMWrap):
    """(input_ids, lengths) -> (state, log_probs zero past length): the module run once over
    the padded prompts from a zero state, with its native layers. Exported to ONNX, its
    recurrent nodes then get the lengths as `sequence_lens`
    (`onnx_compose.with_sequence_lens`), which makes the state each row's own; run eagerly,
    the state is the one after the padding (`LMPrefillRows` is the eager reference)."""

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        width = sum(lay.width for lay in self.tree.layouts)
        zeros = (input_ids[:, :1] * 0).float().expand(-1, width)  # (B, S), follows the batch
        x = _lm_input(input_ids, self.time_major)
        out, state = self._run(x, zeros)
        lp = F.log_softmax(_lm_logits(out, x, self.time_major), dim=-1)
        mask = length_mask(lengths, input_ids.shape[1]).unsqueeze(-1)
        return state, torch.where(mask, lp, torch.zeros_like(lp))


class LMPrefillRows(LMPrefillWrap):
    """The eager reference of the prefill: each row run alone over its own tokens (so its
    state is the one after its last token, exactly), then padded back into the batch."""

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        states, lps = [], []
        for row, n in enumerate(lengths.tolist()):
            state, lp = super().forward(input_ids[row:row + 1, :n], lengths[row:row + 1])
            pad = lp.new_zeros(1, input_ids.shape[1] - n, lp.shape[2])
            states.append(state)
            lps.append(torch.cat([lp, pad], dim=1))
        return torch.cat(states), torch.cat(lps)


class LMStepWrap(_LMWrap):
    """(prev_ids (R,), state (R, S)) -> (new_state, log_probs (R, V)): the module on one
    token per row (its native layers)."""

    def forward(self, prev_ids: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        x = prev_ids.unsqueeze(0 if self.time_major else 1)  # (1, R) or (R, 1)
        out, new_state = self._run(x, state)
        logits = _lm_logits(out, x, self.time_major)[:, 0]  # (R, V)
        return new_state, F.log_softmax(logits, dim=-1)


def lm_time_major(module: nn.Module) -> bool:
    """Whether a module's recurrent layers read (seq, batch) input (nn.LSTM's default)."""
    firsts = {m.batch_first for m in module.modules() if isinstance(m, nn.RNNBase)}
    if len(firsts) != 1:
        why = "its layers differ in batch_first" if firsts else "no nn.LSTM/GRU/RNN inside"
        raise BundleError("cannot tell whether the module reads (batch, seq) or (seq, batch) "
                          f"token ids ({why}): give batch_first=True or False")
    return not firsts.pop()


def lm_state_tree(module: nn.Module, ids: Tensor, time_major: bool) -> StateTree:
    """The nesting and layout of an LM's hidden state: from `init_hidden(batch)` when the
    module has one (the PyTorch word_language_model's), else the shapes its recurrent layers
    suggest, else what `forward(input, None)` returns; checked on two batch sizes."""
    def run(batch: int, hidden: Any) -> Any:
        return module(_lm_input(ids[:batch], time_major), hidden)

    guesses: list[Any] = []
    tried: list[str] = []
    with torch.no_grad():
        init = getattr(module, "init_hidden", None)
        if callable(init):
            try:
                guesses.append((init(3), init(2)))
            except Exception as exc:  # a different signature: try the other ways
                tried.append(f"init_hidden(3) ({type(exc).__name__})")
        for shapes in _candidates(module, 3, 1):
            small = [[_two(s) for s in item] if isinstance(item, list) else _two(item)
                     for item in shapes]
            guesses.append((_zeros(shapes)[0], _zeros(small)[0]))
        try:
            out = run(3, None)
            if isinstance(out, tuple | list) and len(out) == 2:
                guesses.append((out[1], run(2, None)[1]))
        except Exception as exc:  # the module needs a state
            tried.append(f"None ({type(exc).__name__})")
        for big, small in guesses:
            try:
                a, b = run(3, big), run(2, small)
            except Exception as exc:  # this guess does not fit
                tried.append(f"{_shapes([big])} ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            if not (isinstance(a, tuple | list) and len(a) == 2
                    and _shapes([a[1]]) == _shapes([big])):
                tried.append(f"{_shapes([big])} (returned {type(a).__name__})")
                continue
            return _tree([a[1]], [b[1]], 3)
    raise BundleError(
        "forward(input, hidden) -> (logits, hidden): could not find the hidden state the "
        f"module takes (tried {'; '.join(tried) or 'nothing'}). A language model for "
        "seqserve.pack.lm takes token ids and its state, e.g. an LSTM's (h, c) each "
        "(layers, batch, hidden), and returns its logits and the new state in the same shapes "
        "(an init_hidden(batch) method is used when present)")
