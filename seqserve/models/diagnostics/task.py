"""The controlled long-range task for gradient-flow diagnostics, and the per-cell experiment.

Copy-first-token task: a sequence of T tokens drawn uniformly from V symbols; the label is the
*first* token and the loss is taken only at the last step, so the only useful gradient must
travel T-1 steps back. Model: Embedding(V, E) -> single-layer unidirectional RNN/LSTM/GRU ->
Linear(H, V) on h_T. All initialisations are PyTorch's defaults (Embedding N(0, 1); recurrent
and linear weights U(-1/sqrt(H), 1/sqrt(H)); LSTM forget-gate bias not raised), except the
extra LSTM entries of `forget_biases`: the same weights (same seed) with the forget-gate bias
set to B (b_ih[f] = B, b_hh[f] = 0, models.rnn.init_forget_bias), named "lstm fb=B".
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.diagnostics.gradient_flow import CELL_TYPES, measure_gradient_flow
from seqserve.models.nn.rnn import init_forget_bias

DISTANCES_REPORTED = (1, 10, 25, 50, 100)
"""Distances whose norm is copied into `norm_at_distance` (those < T)."""


@dataclass(frozen=True)
class GradientDiagnosticsConfig:
    """Settings of `seqserve diagnose gradients`."""

    cells: tuple[str, ...] = ("rnn", "lstm", "gru")  # Cell types measured, in order.
    length: int = 60  # Sequence length T (the longest distance measured is T-1).
    hidden_size: int = 64  # Hidden size H.
    embed_size: int = 0  # Input (embedding) width E; 0 means E = H.
    vocab_size: int = 8  # Number of symbols V (chance accuracy 1/V).
    probe_batch: int = 128  # Rows of the fixed probe batch the gradients are averaged over.
    train_batch: int = 64  # Rows per training step.
    train_steps: int = 300  # Adam steps of the short training run (0: measure at init only).
    lr: float = 1e-2  # Adam learning rate.
    # Training lengths grow linearly from 2 to T over the first 70% of steps (then T).
    curriculum: bool = True
    clip: float = 1.0  # Gradient-norm clipping during training.
    seed: int = 0  # Seeds the weights, the probe batch and the training batches.
    # LSTM forget-gate biases measured besides PyTorch's init: one "lstm fb=B" entry each (needs
    # "lstm" in cells).
    forget_biases: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        unknown = [c for c in self.cells if c not in CELL_TYPES]
        if not self.cells or unknown:
            raise ValueError(f"cells={self.cells!r}: use one or more of {', '.join(CELL_TYPES)}")
        if self.length < 3:
            raise ValueError(f"length={self.length} must be >= 3")
        for name in ("hidden_size", "vocab_size", "probe_batch", "train_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.embed_size < 0 or self.train_steps < 0:
            raise ValueError("embed_size and train_steps must be >= 0")
        if self.lr <= 0 or self.clip <= 0:
            raise ValueError(f"lr={self.lr} and clip={self.clip} must be > 0")
        if self.forget_biases and "lstm" not in self.cells:
            raise ValueError(f"forget_biases={self.forget_biases} need 'lstm' in cells: add it")

    def entries(self) -> list[tuple[str, str, float | None]]:
        """(name, cell, forget bias or None) of every measured entry, in order."""
        out: list[tuple[str, str, float | None]] = []
        for cell in self.cells:
            out.append((cell, cell, None))
            if cell == "lstm":
                out += [(f"lstm fb={b:g}", "lstm", b) for b in self.forget_biases]
        return out

    @property
    def input_size(self) -> int:
        """E, resolved."""
        return self.embed_size or self.hidden_size


def copy_batch(batch: int, length: int, vocab: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Outputs: tokens (B, T) int64 uniform in [0, V), labels (B,) = tokens[:, 0]."""
    tokens = torch.randint(vocab, (batch, length), generator=gen)  # (B, T)
    return tokens, tokens[:, 0].clone()


class CopyModel(nn.Module):
    """Embedding -> one unidirectional recurrent layer -> linear head on the last state."""

    def __init__(self, cell: str, vocab: int, embed: int, hidden: int,
                 forget_bias: float | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = CELL_TYPES[cell][0](embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, vocab)
        init_forget_bias(self.rnn, forget_bias)

    def forward(self, tokens: Tensor, labels: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Inputs: tokens (B, T) int64, labels (B,) or None.
        Outputs: logits (B, V), mean cross-entropy loss or None."""
        out, _ = self.rnn(self.embed(tokens))  # (B, T, H)
        logits = self.head(out[:, -1])  # (B, V)
        loss = None if labels is None else F.cross_entropy(logits, labels)
        return logits, loss


def measure_copy(model: CopyModel, tokens: Tensor, labels: Tensor) -> dict[str, Any]:
    """Gradient flow of the task loss itself (in float64, on a copy of the model), plus the
    probe batch's loss and accuracy."""
    with torch.no_grad():
        logits, loss = model(tokens, labels)
    model64 = copy.deepcopy(model).double()
    inputs = model64.embed(tokens).detach()  # (B, T, E) float64

    def readout(h_last: Tensor) -> Tensor:  # (B, H) -> (B,)
        return F.cross_entropy(model64.head(h_last), labels, reduction="none")

    result = measure_gradient_flow(model64.rnn, tokens.shape[1], inputs=inputs, readout=readout)
    result["loss"] = float(loss) if loss is not None else float("nan")
    result["accuracy"] = float((logits.argmax(-1) == labels).float().mean())
    result["norm_at_distance"] = {
        str(d): result["norms"][d] for d in DISTANCES_REPORTED if d < len(result["norms"])
    }
    return result


def train_length(cfg: GradientDiagnosticsConfig, step: int) -> int:
    """Sequence length used at training step `step` (1-based)."""
    if not cfg.curriculum:
        return cfg.length
    ramp = max(1.0, 0.7 * cfg.train_steps)
    return min(cfg.length, 2 + int((cfg.length - 2) * step / ramp))


def train_copy(
    model: CopyModel, cfg: GradientDiagnosticsConfig, gen: torch.Generator,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Short Adam run on fresh batches; returns steps and the mean loss of the last 20 steps
    (all at length T when the curriculum ramp ends before them)."""
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses: list[float] = []
    every = max(1, cfg.train_steps // 5)
    for step in range(1, cfg.train_steps + 1):
        length = train_length(cfg, step)
        tokens, labels = copy_batch(cfg.train_batch, length, cfg.vocab_size, gen)
        _, loss = model(tokens, labels)
        assert loss is not None
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        losses.append(loss.item())
        if step % every == 0 or step == cfg.train_steps:
            mean = sum(losses[-20:]) / len(losses[-20:])
            log(f"    step {step}/{cfg.train_steps} length {length} loss {mean:.3f}")
    tail = losses[-20:]
    return {"steps": cfg.train_steps, "curriculum": cfg.curriculum,
            "final_loss": sum(tail) / len(tail) if tail else None}


def run_cell(cell: str, cfg: GradientDiagnosticsConfig, log: Callable[[str], None],
             # Init and trained measurements of one cell type on the same probe batch (an LSTM with
             # its forget-gate bias set to `forget_bias`, if given).
             forget_bias: float | None = None) -> dict:
    torch.manual_seed(cfg.seed)
    model = CopyModel(cell, cfg.vocab_size, cfg.input_size, cfg.hidden_size, forget_bias)
    if forget_bias is not None:
        cell = f"{cell} fb={forget_bias:g}"
    probe_gen = torch.Generator().manual_seed(cfg.seed + 1)
    tokens, labels = copy_batch(cfg.probe_batch, cfg.length, cfg.vocab_size, probe_gen)
    start = time.perf_counter()
    phases = {"init": measure_copy(model, tokens, labels)}
    log(f"  {cell} init: {_summary(phases['init'])}")
    if cfg.train_steps:
        train_gen = torch.Generator().manual_seed(cfg.seed + 2)
        train = train_copy(model, cfg, train_gen, log)
        phases["trained"] = measure_copy(model, tokens, labels)
        phases["trained"]["train"] = train
        log(f"  {cell} trained: {_summary(phases['trained'])}")
    log(f"  {cell} done in {time.perf_counter() - start:.1f}s")
    return phases


def _summary(m: dict[str, Any]) -> str:
    at = m["norm_at_distance"]
    far = max(at, key=int) if at else None
    far_txt = f", norm@{far}={at[far]:.2e}" if far else ""
    return (f"decay {m['decay_rate_per_step']:+.3f}/step (x{m['decay_factor_per_step']:.3f})"
            f"{far_txt}, sigma(W_hh)={m['spectral_norm']['stacked']:.3f}, "
            f"probe acc {m['accuracy']:.2f}")
