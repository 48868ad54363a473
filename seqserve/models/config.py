"""Model and training configuration: one frozen dataclass per model, plus the training loop's.

Bases: `StackConfig` (the recurrent stack of every model, nn/forecaster.py's ForecasterConfig
included) -> `RecurrentConfig` (over token ids: classifier, tagger, translator, nn/lm.py's
LMConfig); `FitConfig` (what models/train/loop.py's fit loop reads) -> `TrainConfig` and
train/forecast.py's ForecastTrainConfig.

Every field has a default and a one-line doc (the string below it). `__post_init__` checks
cross-field constraints and raises ValueError naming the field and the fix. `to_dict` and
`from_dict` round-trip through JSON (run directory `config.json`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from seqserve.models.errors import UserError
from seqserve.models.text.normalization import RULES

CELLS = ("rnn", "lstm", "gru")
ATTENTIONS = ("additive", "dot", "general")
DECODERS = ("none", "bahdanau", "luong")
DECODER_SCORES = {"none": ("none",), "bahdanau": ("additive",),
                  "luong": ("additive", "dot", "general")}
"""The attention scores each translator decoder takes, its default first."""
DEFAULT_FORGET_BIAS = 1.0
"""LSTM forget-gate bias at initialisation of every family (docs/decoders.md: measured)."""


def _check_common(cfg: RecurrentConfig) -> None:
    if cfg.cell not in CELLS:
        raise ValueError(f"cell={cfg.cell!r} is unknown: use one of {', '.join(CELLS)}")
    check_variant(cfg)
    if isinstance(cfg, ClassifierConfig) and cfg.attention not in ATTENTIONS:
        raise ValueError(
            f"attention={cfg.attention!r} is unknown: use one of {', '.join(ATTENTIONS)}"
        )
    if cfg.forget_bias is not None and not -10.0 <= cfg.forget_bias <= 10.0:
        raise ValueError(f"forget_bias={cfg.forget_bias} must be in [-10, 10] (or None for "
                         "PyTorch's default init): use 1 or 2")
    for name in ("vocab_size", "embed_size", "hidden_size", "num_layers", "max_length"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"{name}={getattr(cfg, name)} must be >= 1")
    if not 0.0 <= cfg.dropout < 1.0:
        raise ValueError(f"dropout={cfg.dropout} must be in [0, 1)")
    check_ids(cfg, ("pad_id",))


def check_ids(cfg: RecurrentConfig, names: tuple[str, ...]) -> None:
    """Each named special id (pad_id, bos_id, eos_id) lies inside the vocabulary."""
    for name in names:
        if not 0 <= getattr(cfg, name) < cfg.vocab_size:
            raise ValueError(f"{name}={getattr(cfg, name)} must lie inside "
                             f"vocab_size={cfg.vocab_size}")


def check_variant(cfg: RecurrentConfig) -> None:
    """proj_size / peephole / cifg are LSTM variants (models/nn/lstm_variants.py)."""
    if (cfg.proj_size or cfg.peephole or cfg.cifg) and cfg.cell != "lstm":
        raise ValueError(f"proj_size/peephole/cifg need cell='lstm' (got cell={cfg.cell!r}): "
                         "set cell='lstm' or turn the variant off")
    hidden = getattr(cfg, "encoder_hidden", cfg.hidden_size)
    if not 0 <= cfg.proj_size < hidden:
        raise ValueError(f"proj_size={cfg.proj_size} must be in [0, {hidden}) (the RNN hidden "
                         "size per direction): use a smaller proj_size or 0 for none")


def _check_decoder(cfg: TranslatorConfig) -> None:
    """The decoder, its attention score and input feeding go together (DECODER_SCORES)."""
    if cfg.decoder not in DECODERS:
        raise ValueError(f"decoder={cfg.decoder!r} is unknown: use one of {', '.join(DECODERS)}")
    scores = DECODER_SCORES[cfg.decoder]
    if cfg.attention not in scores:
        fix = ("set attention='none' (the fixed-context decoder has no attention)"
               if cfg.decoder == "none" else
               f"use attention={' or '.join(repr(s) for s in scores)}"
               + (" or decoder='luong'" if cfg.decoder == "bahdanau" else ""))
        raise ValueError(f"attention={cfg.attention!r} does not apply to decoder="
                         f"{cfg.decoder!r}: {fix}")
    if cfg.input_feeding and cfg.decoder != "luong":
        raise ValueError(f"input_feeding=True applies to decoder='luong' only (got decoder="
                         f"{cfg.decoder!r}): drop input_feeding or set decoder='luong'")


def translator_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides with the decoder's default score filled in when only the decoder is given
    (`decoder='none'` alone means attention 'none')."""
    decoder = overrides.get("decoder")
    if decoder in DECODER_SCORES and "attention" not in overrides:
        return {**overrides, "attention": DECODER_SCORES[decoder][0]}
    return overrides


class _DictMixin:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build from a dict; unknown keys raise ValueError naming them."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(
                f"unknown {cls.__name__} field(s) {unknown}: valid are {sorted(names)}"
            )
        return cls(**data)

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, Any] | None, what: str) -> Self:
        """The defaults with `overrides` applied; a bad or unknown value raises UserError
        ("bad {what} option: ...")."""
        try:
            return cls.from_dict(dict(overrides or {}))
        except (ValueError, TypeError) as exc:
            raise UserError(f"bad {what} option: {exc}") from exc

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields changed (checks run again)."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True)
class StackConfig(_DictMixin):
    """A stack of recurrent layers: what every recurrent model has (the base of
    RecurrentConfig and nn/forecaster.py's ForecasterConfig); each family changes the
    defaults it needs and takes the cells its own CELLS names."""

    hidden_size: int = 128
    """RNN hidden size H per layer and direction (a translator's model width: memory and
    decoder size, each encoder direction H/2 when bidirectional)."""
    num_layers: int = 1
    """Stacked RNN layers (a translator's: in the encoder and in the decoder)."""
    cell: str = "lstm"
    """Recurrent cell: rnn (Elman, tanh) | lstm | gru."""
    dropout: float = 0.1
    """Dropout between RNN layers (training only) and, in the token models, on embeddings and
    before the head or output projection."""
    forget_bias: float | None = DEFAULT_FORGET_BIAS
    """LSTM forget-gate bias at init: b_ih[f] = B, b_hh[f] = 0 in every LSTM layer (None:
    PyTorch's default uniform init); rnn and gru cells have no forget gate and ignore it."""


@dataclass(frozen=True)
class RecurrentConfig(StackConfig):
    """What every model over token ids with a recurrent stack has (the base of
    ClassifierConfig, TranslatorConfig, TaggerConfig and nn/lm.py's LMConfig); each family
    changes the defaults it needs."""

    vocab_size: int = 8000
    """Tokenizer vocabulary size (embedding rows; a translator's joint source/target one)."""
    embed_size: int = 128
    """Token embedding width E."""
    max_length: int = 128
    """Longest input in tokens the model is exported and served for (a translator's hard cap
    on decoded length too)."""
    pad_id: int = 0
    """Padding token id (embedding row kept at zero)."""
    proj_size: int = 0
    """LSTM recurrent projection size P (0 = none; a translator's encoder only); outputs and h
    are P wide (P < H)."""
    peephole: bool = False
    """LSTM peephole connections (gates also see the cell state)."""
    cifg: bool = False
    """LSTM coupled input-forget gate (input gate = 1 - forget gate)."""


@dataclass(frozen=True)
class EncoderConfig(RecurrentConfig):
    """A (bi)RNN encoder over token ids with a head over C labels: what the classifier and
    the tagger share."""

    num_labels: int = 5
    """Number of labels C (a classifier's classes, a tagger's tags)."""
    bidirectional: bool = True
    """Run a backward direction too (output width 2H)."""

    def _check_labels(self, family: str) -> None:
        _check_common(self)
        if self.num_labels < 2:
            raise ValueError(f"num_labels={self.num_labels} must be >= 2: a {family} needs 2+")

    @property
    def output_size(self) -> int:
        """Width of the RNN outputs: H (or P with a projection) times the directions."""
        return (self.proj_size or self.hidden_size) * (2 if self.bidirectional else 1)


@dataclass(frozen=True)
class ClassifierConfig(EncoderConfig):
    """Embedding -> stacked (bi)RNN -> attention pooling -> MLP head (DESIGN.md canonical)."""

    vocab_size: int = 20000
    num_layers: int = 2
    dropout: float = 0.2
    max_length: int = 256
    attention: str = "additive"
    """Pooling score: additive (MLP, tanh) | dot (learned query) | general (bilinear query)."""
    head_size: int = 64
    """Hidden width of the MLP head."""

    def __post_init__(self) -> None:
        self._check_labels("classifier")
        if self.head_size < 1:
            raise ValueError(f"head_size={self.head_size} must be >= 1")


@dataclass(frozen=True)
class TranslatorConfig(RecurrentConfig):
    """(Bi)RNN encoder -> bridge -> decoder: fixed-context (none), Bahdanau or Luong."""

    hidden_size: int = 256
    cell: str = "gru"
    bidirectional: bool = True
    """Bidirectional encoder (padding-safe)."""
    attention: str = "additive"
    """Attention score: additive (v^T tanh(W q + U m), Luong's "concat") | dot | general
    (luong); bahdanau takes additive only, none takes none (DECODER_SCORES)."""
    decoder: str = "luong"
    """none: fixed context (the encoder's final state, fed at every step) | bahdanau: align
    from s_{t-1}, context enters the RNN step | luong: RNN step, then align from h_t."""
    input_feeding: bool = False
    """Luong input feeding: the previous attentional vector joins the next RNN input."""
    bos_id: int = 2
    """Begin-of-sequence id (first decoder input)."""
    eos_id: int = 3
    """End-of-sequence id (decoding stops)."""

    def __post_init__(self) -> None:
        _check_common(self)
        _check_decoder(self)
        if self.bidirectional and self.hidden_size % 2:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be even with bidirectional=True "
                "(each direction gets half): use an even hidden_size"
            )
        if self.attention == "dot" and self.memory_size != self.hidden_size:
            raise ValueError(f"attention='dot' needs memory_size={self.memory_size} == "
                             f"hidden_size={self.hidden_size}: drop proj_size or use 'general'")
        check_ids(self, ("bos_id", "eos_id"))

    @property
    def has_attention(self) -> bool:
        """False for the fixed-context decoder (its decode_step attention is all zeros)."""
        return self.decoder != "none"

    @property
    def extra_state(self) -> int:
        """Width of the decoder state after the RNN blocks: the fixed context (none, D), the
        previous attentional vector (luong with input feeding, H), else 0."""
        if self.decoder == "none":
            return self.memory_size
        return self.hidden_size if self.input_feeding else 0

    @property
    def encoder_hidden(self) -> int:
        """Hidden size of each encoder direction."""
        return self.hidden_size // 2 if self.bidirectional else self.hidden_size

    @property
    def memory_size(self) -> int:
        """Width of the encoder memory: H, or the directions' projections concatenated."""
        return (self.proj_size or self.encoder_hidden) * (2 if self.bidirectional else 1)

    @property
    def state_layers(self) -> int:
        """Number of (L, H) blocks packed in the flat decoder state: L, or 2L for LSTM (h, c)."""
        return self.num_layers * (2 if self.cell == "lstm" else 1)

    @property
    def state_dim(self) -> int:
        """Width of the flat decoder state per row: the RNN blocks, then `extra_state`."""
        return self.state_layers * self.hidden_size + self.extra_state


@dataclass(frozen=True)
class TaggerConfig(EncoderConfig):
    """Embedding -> stacked (bi)RNN -> per-token linear softmax head (sequence labeling)."""

    vocab_size: int = 4000
    embed_size: int = 64
    hidden_size: int = 96
    num_layers: int = 2
    num_labels: int = 12

    def __post_init__(self) -> None:
        self._check_labels("tagger")


@dataclass(frozen=True)
class FitConfig(_DictMixin):
    """What the fit loop (models/train/loop.py) reads from every trainer's config: AdamW,
    the learning-rate schedule, clipping, early stopping, seed and threads. TrainConfig and
    train/forecast.py's ForecastTrainConfig extend it, change the defaults they need and name
    their own epoch limit and time budget (`epoch_limit`, `time_budget_s`, `budget_text`)."""

    lr: float = 2e-3
    """AdamW peak learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    warmup_steps: int = 50
    """Linear learning-rate warm-up steps."""
    lr_schedule: str = "linear"
    """After warm-up: constant | linear (to 10% at the last planned step) | budget (linear,
    or faster when the time budget runs out first)."""
    clip_norm: float = 1.0
    """Gradient-norm clipping threshold (<= 0 disables)."""
    patience: int = 3
    """Early stopping: epochs without improvement of the main validation metric (0 = never)."""
    seed: int = 0
    """Seed for torch and python: initialisation, dropout and the batch order."""
    num_threads: int = 2
    """torch intra-op threads."""

    def _check_fit(self) -> None:
        if self.num_threads < 1:
            raise ValueError(f"num_threads={self.num_threads} must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr={self.lr} must be > 0")
        if self.lr_schedule not in ("constant", "linear", "budget"):
            raise ValueError(f"lr_schedule={self.lr_schedule!r}: use constant, linear or budget")
        if self.patience < 0 or self.warmup_steps < 0:
            raise ValueError("patience and warmup_steps must be >= 0")

    @property
    def epoch_limit(self) -> int:
        """Most epochs the loop runs."""
        raise NotImplementedError

    @property
    def time_budget_s(self) -> float:
        """Time budget of the training epochs in seconds (0 = none)."""
        raise NotImplementedError

    @property
    def budget_text(self) -> str:
        """The budget as the stop reason names it ("time budget of ...")."""
        raise NotImplementedError


@dataclass(frozen=True)
class TrainConfig(FitConfig):
    """The training loop of the classifier, tagger, translator and language model: the fit
    loop's settings, batching, stopping, tokenizer."""

    epochs: int = 10
    """Maximum epochs."""
    batch_size: int = 64
    """Examples per training batch."""
    eval_batch_size: int = 256
    """Examples per validation/test batch."""
    label_smoothing: float = 0.0
    """Cross-entropy label smoothing."""
    scheduled_sampling: float = 0.0
    """Translator: final probability of feeding the model's own prediction (ramps per epoch)."""
    max_minutes: float = 0.0
    """Wall-time budget for the training epochs in minutes (0 = none); best checkpoint kept."""
    bucket_chunk: int = 32
    """Batches per length-sorted chunk (length bucketing); 1 = no bucketing."""
    tokenizer_type: str = "unigram"
    """sentencepiece model type: unigram | bpe | word | char."""
    tokenizer_normalization: str = ""
    """Tokenizer normalization (models/text/normalization.py RULES); "" = the dataset's own
    (`Dataset.normalization`: "nmt_nfkc_cf_punct" for the number datasets), else nmt_nfkc_cf."""
    max_train_examples: int = 0
    """Use at most this many training examples (0 = all)."""
    max_eval_examples: int = 0
    """Validate on at most this many examples per epoch (0 = all); test uses all."""
    tbptt: int = 0
    """Truncated BPTT chunk length K in steps (0 = full BPTT); classifier and tagger only."""
    gradient_flow_every: int = 0
    """Measure gradient flow (models/diagnostics/gradient_flow.py) every N steps into
    gradient_flow.jsonl (0 = off)."""

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "eval_batch_size", "bucket_chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        self._check_fit()
        if not 0.0 <= self.scheduled_sampling <= 1.0:
            raise ValueError(f"scheduled_sampling={self.scheduled_sampling} must be in [0, 1]")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={self.label_smoothing} must be in [0, 1)")
        if self.tokenizer_type not in ("unigram", "bpe", "word", "char"):
            raise ValueError(
                f"tokenizer_type={self.tokenizer_type!r}: use unigram, bpe, word or char"
            )
        if self.tokenizer_normalization and self.tokenizer_normalization not in RULES:
            raise ValueError(f"tokenizer_normalization={self.tokenizer_normalization!r}: use "
                             f"one of {', '.join(RULES)} (or \"\" for the dataset's own)")
        if self.max_minutes < 0:
            raise ValueError(f"max_minutes={self.max_minutes} must be >= 0")
        if self.tbptt < 0 or self.gradient_flow_every < 0:
            raise ValueError("tbptt and gradient_flow_every must be >= 0 (0 = off)")

    @property
    def epoch_limit(self) -> int:
        return self.epochs

    @property
    def time_budget_s(self) -> float:
        return self.max_minutes * 60

    @property
    def budget_text(self) -> str:
        return f"{self.max_minutes} min"


def check_recurrent(config: Any, cells: tuple[str, ...], positive: tuple[str, ...]) -> None:
    """The checks every recurrent model config shares: a known cell, 1-3 layers, the named
    sizes >= 1 and dropout in [0, 1) (ValueError naming the field)."""
    if config.cell not in cells:
        raise ValueError(f"cell={config.cell!r}: use one of {', '.join(cells)}")
    if not 1 <= config.num_layers <= 3:
        raise ValueError(f"num_layers={config.num_layers} must be 1, 2 or 3")
    for name in positive:
        if getattr(config, name) < 1:
            raise ValueError(f"{name}={getattr(config, name)} must be >= 1")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"dropout={config.dropout} must be in [0, 1)")
