"""Export a module that packs its batches (`pack_padded_sequence` / `pad_packed_sequence`) as
written: `export_friendly_packing(module)` is a context manager in which those calls are
replaced by export-friendly, length-aware equivalents with the same results.

Neither ONNX exporter exports packing (dynamo: "zeros(): argument 'size' ... got
FakeTensor"; TorchScript-based: "vector::_M_range_check"). Within the context:

- `pack_padded_sequence(input, lengths, batch_first=..., enforce_sorted=...)` returns a
  `PaddedWithLengths` (the padded batch, batch-first, and its lengths; rows in their given
  order, so sorting is not needed), whether the module calls it as
  `torch.nn.utils.rnn.pack_padded_sequence` or imported it into its own module
  (`from torch.nn.utils.rnn import pack_padded_sequence`: the name is replaced in the
  globals of every module that defines one of its submodules' classes);
- every nn.LSTM / nn.GRU / nn.RNN inside the module, given a `PaddedWithLengths`, runs
  within each row's length (`models.nn.masked_rnn.run_within_lengths`: outputs zeroed past
  each length, h_n / c_n after each row's last valid step, the backward direction over each
  row reversed within its length) and returns its output as a `PaddedWithLengths`; given
  anything else it runs as before;
- `pad_packed_sequence(sequence, batch_first=..., padding_value=..., total_length=...)`
  returns (padded outputs, lengths).

Every replaced name is restored on leaving, also on an error. The eager module (outside the
context, real packing) stays the reference the exported graphs are compared with.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.utils.rnn as rnn_utils
from torch import Tensor, nn

from seqserve.models.nn.masked_rnn import run_within_lengths, supported
from seqserve.models.nn.rnn import length_mask


@dataclass
class PaddedWithLengths:
    """What `pack_padded_sequence` returns during export: data (B, T, ...) and lengths (B,)."""

    data: Tensor
    lengths: Tensor

    def to(self, *args: Any, **kwargs: Any) -> PaddedWithLengths:
        return PaddedWithLengths(self.data.to(*args, **kwargs), self.lengths)


def _lengths(lengths: Any, like: Tensor) -> Tensor:
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths)
    return lengths.to(device=like.device, dtype=torch.int64)


class Replaced:
    """What `export_friendly_packing` replaced, and whether the module called packing."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.packed = 0
        """How many times the module called pack_padded_sequence."""


_ACTIVE: list[Replaced] = []


def _pack(input: Tensor, lengths: Any, batch_first: bool = False,
          enforce_sorted: bool = True) -> PaddedWithLengths:
    for active in _ACTIVE:
        active.packed += 1
    data = input if batch_first else input.transpose(0, 1)
    return PaddedWithLengths(data, _lengths(lengths, input))


def _pad(sequence: Any, batch_first: bool = False, padding_value: float = 0.0,
         total_length: int | None = None) -> tuple[Tensor, Tensor]:
    data, lengths = sequence.data, sequence.lengths  # (B, T, ...)
    if padding_value:
        mask = length_mask(lengths, data.shape[1]).reshape(*data.shape[:2],
                                                           *[1] * (data.dim() - 2))
        data = torch.where(mask, data, torch.full_like(data, padding_value))
    if total_length is not None and total_length != data.shape[1]:
        if total_length < data.shape[1]:
            data = data[:, :total_length]
        else:
            pad = data.new_full((data.shape[0], total_length - data.shape[1], *data.shape[2:]),
                                padding_value)
            data = torch.cat([data, pad], dim=1)
    return (data if batch_first else data.transpose(0, 1)), lengths


def _rnn_forward(original: Any) -> Any:
    """The forward of an nn.RNNBase during export: length-aware on a `PaddedWithLengths`."""

    def forward(self: nn.RNNBase, input: Any, hx: Any = None) -> Any:
        if not isinstance(input, PaddedWithLengths):
            return original(input, hx)
        output, h_n, c_n = run_within_lengths(self, input.data, input.lengths, hx,
                                              batch_first=True)
        packed = PaddedWithLengths(output, input.lengths)
        return packed, ((h_n, c_n) if isinstance(self, nn.LSTM) else h_n)

    return forward


_MISSING = object()


@contextmanager
def export_friendly_packing(module: nn.Module) -> Iterator[Replaced]:
    """Within: packing in `module` is replaced (module doc). Yields what was replaced and
    counts the module's packing calls."""
    originals = {"pack_padded_sequence": (rnn_utils.pack_padded_sequence, _pack),
                 "pad_packed_sequence": (rnn_utils.pad_packed_sequence, _pad)}
    undo: list[tuple[Any, str, Any]] = []
    made = Replaced()

    def replace(owner: Any, name: str, new: Any, what: str) -> None:
        undo.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, new)
        made.names.append(what)

    try:
        for name, (_old, new) in originals.items():
            replace(rnn_utils, name, new, f"torch.nn.utils.rnn.{name}")
        seen: set[str] = set()
        for sub in module.modules():
            where = sys.modules.get(type(sub).__module__)
            if where is None or where.__name__ in seen or where is rnn_utils:
                continue
            seen.add(where.__name__)
            for name, value in list(vars(where).items()):
                for known, (old, new) in originals.items():
                    if value is old:
                        replace(where, name, new, f"{where.__name__}.{name} ({known})")
        for sub in module.modules():
            if isinstance(sub, nn.RNNBase) and supported(sub) is None:
                replace(sub, "forward", types.MethodType(_rnn_forward(sub.forward), sub),
                        f"{type(sub).__name__}.forward")
        _ACTIVE.append(made)
        yield made
    finally:
        if made in _ACTIVE:
            _ACTIVE.remove(made)
        for owner, name, old in reversed(undo):
            if old is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, old)
