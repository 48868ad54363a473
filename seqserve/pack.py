"""Serve your own model: pack a PyTorch module as a verified seqserve bundle.

    import seqserve.pack
    seqserve.pack.classifier(model, tokenizer="tokenizer.json", labels=["en", "fr"],
                             repo="model_repository", name="names")
    seqserve.pack.tagger(model, tokenizer=..., labels=..., repo=..., name=...)
    seqserve.pack.translator(model, source_tokenizer=..., target_tokenizer=..., repo=...,
                             name=...)        # model.encode(ids, lengths), model.step(...)
    seqserve.pack.lm(model, tokenizer="chars.json", repo=..., name=...)  # model(input, hidden)
    rnn = seqserve.pack.bidirectional(nn.GRU(..., bidirectional=True))  # rnn(x, lengths)
    seqserve.pack.sequence_tagger(model, features=3, outputs=1, normalization={"mean": [...],
                                  "std": [...]}, repo=..., name=...)  # model(x, lengths[, h])
    seqserve.pack.sequence_classifier(model, features=3, labels=["ok", "fault"], ...)
    rnn = seqserve.pack.length_aware(nn.LSTM(...))  # rnn(x, lengths, hx): state at each end

Each call exports ONNX and TorchScript with dynamic axes from a wrapper around the module
(log-softmax, top-k, memory gather, state flattening for the served contract), compares both
with the eager module on random padded batches (parity and batch invariance) and writes
`repo/name/VERSION` (docs/bundle-format.md). Imports torch.
"""

from __future__ import annotations

from typing import Any


def classifier(module: Any, **kwargs: Any) -> Any:
    """`module(ids, lengths)` -> logits or (logits, attention): see `export.pack.api`."""
    from seqserve.export.pack.api import classifier as pack

    return pack(module, **kwargs)


def tagger(module: Any, **kwargs: Any) -> Any:
    """`module(ids, lengths)` -> per-token logits, or a CRF tagger (the PyTorch tutorial's
    BiLSTM_CRF, a torchcrf-style layer; `emissions=`, `crf=`): see `export.pack.api`."""
    from seqserve.export.pack.api import tagger as pack

    return pack(module, **kwargs)


def translator(module: Any = None, **kwargs: Any) -> Any:
    """`module.encode(ids, lengths)` and `module.step(prev_ids, state..., memory, mask)` (or
    `encoder=` and `step=`): see `export.pack.api`."""
    from seqserve.export.pack.api import translator as pack

    return pack(module, **kwargs)


def lm(module: Any, **kwargs: Any) -> Any:
    """`module(input, hidden)` -> (logits, new hidden), the PyTorch word_language_model's
    RNNModel: see `export.pack.api.lm`."""
    from seqserve.export.pack.api import lm as pack

    return pack(module, **kwargs)


def sequence_classifier(module: Any, **kwargs: Any) -> Any:
    """`module(features, lengths)` -> outputs (B, k), or `module(features, lengths, state...)`
    -> (outputs, new state...): see `export.pack.api.sequence_classifier`."""
    from seqserve.export.pack.api import sequence_classifier as pack

    return pack(module, **kwargs)


def sequence_tagger(module: Any, **kwargs: Any) -> Any:
    """`module(features, lengths)` -> outputs (B, T, k), or `module(features, lengths,
    state...)` -> (outputs, new state...): see `export.pack.api.sequence_tagger`."""
    from seqserve.export.pack.api import sequence_tagger as pack

    return pack(module, **kwargs)


def length_aware(rnn: Any) -> Any:
    """A drop-in wrapper around a unidirectional nn.LSTM / nn.GRU / nn.RNN that keeps its
    weights and returns each row's state after its own last valid step: `rnn(x, lengths,
    hx=None)` -> (output, h_n) (an LSTM: (output, (h_n, c_n))), exportable by either of
    PyTorch's ONNX exporters with a dynamic batch and time axis."""
    from seqserve.models.nn.length_aware import LengthAwareRNN

    return LengthAwareRNN(rnn)


def bidirectional(rnn: Any) -> Any:
    """A drop-in wrapper around a bidirectional nn.LSTM / nn.GRU that keeps its weights and
    runs the backward direction within each row's length: call it as `rnn(x, lengths)`;
    exportable by either of PyTorch's ONNX exporters with a dynamic batch and time axis."""
    from seqserve.models.nn.bidirectional import LengthAwareBidirectional

    return LengthAwareBidirectional(rnn)


__all__ = ["bidirectional", "classifier", "length_aware", "lm", "sequence_classifier",
           "sequence_tagger", "tagger", "translator"]
