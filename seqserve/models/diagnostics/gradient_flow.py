"""Gradient-flow diagnostics for recurrent layers: ||dL_T/dh_k|| against the distance T - k.

The measurement unrolls one layer (one direction) of an `nn.RNN` / `nn.LSTM` / `nn.GRU` step by
step through an `nn.RNNCell` / `nn.LSTMCell` / `nn.GRUCell` that *shares the layer's Parameter
objects* (`cell_view`), keeps every per-step hidden state h_k and asks autograd for the gradient
of the last step's loss with respect to each of them. Per row the gradient norm is taken, then
averaged over the batch. The loss is summed over rows, so each row's gradient is that row's own
dL_T/dh_k (rows do not interact in a recurrent layer).

Decay rate per step = least-squares slope of ln(mean norm) against distance over distances
1..T-1 (distance 0 is the head's direct gradient); negative means vanishing, positive exploding.
The decay factor per step is exp(slope).

The unroll runs in float64 by default (on a copy of the cell), because a vanilla RNN's norms
fall below float32's smallest value within a few dozen steps. `torch.autograd.grad` is used,
never `.backward()`, so a measurement leaves the parameters' `.grad` untouched and can run in
the middle of a training loop; random inputs and the random readout direction come from a
private generator, so the caller's RNG stream is not consumed.

Training runs opt in with `gradient_flow_callback(every_n, ...)`:

    monitor = gradient_flow_callback(every_n=200, length=50,
                                     out_path=run_dir / "gradient_flow.jsonl", layer=0)
    for step, batch in enumerate(loader, start=1):
        ...; optimizer.step()
        monitor(step, model.encoder.rnn)            # measures when step % every_n == 0

By default each measurement feeds N(0, 1) noise and reads out a fixed random direction of h_T
(a loss-free probe of the Jacobian chain); pass `inputs=` (the layer's own input batch, e.g.
the embeddings, (B, T, I)) to probe on real data. `layer=` / `reverse=True` pick a stacked
layer / the backward direction of a bidirectional one (its inputs in backward order).

Each measurement is appended to `monitor.history` and, with `out_path`, to a JSONL file (one
`{"step": ..., **measurement}` object per line).
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

CELL_TYPES: dict[str, tuple[Callable[..., nn.RNNBase], Callable[..., nn.RNNCellBase]]] = {
    "rnn": (nn.RNN, nn.RNNCell),
    "lstm": (nn.LSTM, nn.LSTMCell),
    "gru": (nn.GRU, nn.GRUCell),
}
GATE_NAMES = {"rnn": ("h",), "lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n")}
"""Row blocks of weight_hh in PyTorch's stacking order."""
FIT_MIN_DISTANCE = 1
"""Distance 0 (the head's direct gradient) is left out of the decay fit."""

Readout = Callable[[Tensor], Tensor]
"""h_T (B, H) -> per-row loss (B,)."""


def cell_kind(module: nn.Module) -> str:
    """'rnn' | 'lstm' | 'gru' for a recurrent layer or cell; ValueError for anything else."""
    if isinstance(module, nn.LSTM | nn.LSTMCell):
        return "lstm"
    if isinstance(module, nn.GRU | nn.GRUCell):
        return "gru"
    if isinstance(module, nn.RNN | nn.RNNCell):
        return "rnn"
    raise ValueError(f"{type(module).__name__} is not an nn.RNN/LSTM/GRU layer or cell")


def cell_view(rnn: nn.RNNBase, layer: int = 0, reverse: bool = False) -> nn.RNNCellBase:
    """A cell computing one step of `rnn`'s given layer/direction with the *same* Parameters.

    Training either one trains both. LSTM projections (`proj_size > 0`) have no cell form.
    """
    kind = cell_kind(rnn)
    if getattr(rnn, "proj_size", 0):
        raise ValueError("proj_size > 0 has no nn.LSTMCell form: measure a layer without it")
    if not 0 <= layer < rnn.num_layers:
        raise ValueError(f"layer={layer} must lie in [0, {rnn.num_layers})")
    if reverse and not rnn.bidirectional:
        raise ValueError("reverse=True needs a bidirectional layer")
    suffix = f"_l{layer}" + ("_reverse" if reverse else "")
    weight_ih = getattr(rnn, "weight_ih" + suffix)  # (G*H, I)
    cell_cls = CELL_TYPES[kind][1]
    kwargs: dict[str, Any] = {"bias": rnn.bias}
    if kind == "rnn":
        kwargs["nonlinearity"] = "relu" if rnn.mode == "RNN_RELU" else "tanh"
    with torch.device("meta"):
        cell = cell_cls(weight_ih.shape[1], rnn.hidden_size, **kwargs)
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if rnn.bias else [])
    for name in names:
        setattr(cell, name, getattr(rnn, name + suffix))  # shared Parameter, not a copy
    return cell


def as_cell(module: nn.Module, layer: int = 0, reverse: bool = False) -> nn.RNNCellBase:
    """The module itself if it is a cell, else `cell_view(module, layer, reverse)`."""
    if isinstance(module, nn.RNNCellBase):
        return module
    if isinstance(module, nn.RNNBase):
        return cell_view(module, layer, reverse)
    raise ValueError(f"{type(module).__name__} is not an nn.RNN/LSTM/GRU layer or cell")


def unroll(cell: nn.RNNCellBase, inputs: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Run `cell` over `inputs` (B, T, I) from a zero state.

    Outputs: (hs, cs), T tensors (B, H) each: h_1..h_T, and for an LSTM c_1..c_T (else []).
    """
    batch, steps = inputs.shape[:2]
    h = inputs.new_zeros(batch, cell.hidden_size)  # (B, H)
    c = inputs.new_zeros(batch, cell.hidden_size)  # (B, H), LSTM only
    hs: list[Tensor] = []
    cs: list[Tensor] = []
    for t in range(steps):
        x_t = inputs[:, t]  # (B, I)
        if isinstance(cell, nn.LSTMCell):
            h, c = cell(x_t, (h, c))
            cs.append(c)
        else:
            h = cell(x_t, h)
        hs.append(h)
    return hs, cs


def fit_decay_rate(distances: list[int], norms: list[float]) -> float:
    """Slope of ln(norm) vs distance over distances >= 1 with a positive finite norm (nan if
    fewer than two such points)."""
    pts = [
        (d, math.log(n))
        for d, n in zip(distances, norms, strict=True)
        if d >= FIT_MIN_DISTANCE and n > 0 and math.isfinite(n)
    ]
    if len(pts) < 2:
        return math.nan
    slope, _ = statistics.linear_regression([p[0] for p in pts], [p[1] for p in pts])
    return slope


def spectral_norms(module: nn.Module, layer: int = 0, reverse: bool = False) -> dict[str, Any]:
    """Largest singular value of the recurrent matrix weight_hh: the stacked (G*H, H) matrix
    and each gate's (H, H) block (PyTorch order: LSTM i,f,g,o; GRU r,z,n; RNN h)."""
    cell = as_cell(module, layer, reverse)
    kind = cell_kind(cell)
    w_hh = cell.weight_hh.detach().float()  # (G*H, H)
    blocks = w_hh.chunk(len(GATE_NAMES[kind]), dim=0)  # G x (H, H)
    return {
        "stacked": float(torch.linalg.matrix_norm(w_hh, ord=2)),
        "gates": {
            name: float(torch.linalg.matrix_norm(b, ord=2))
            for name, b in zip(GATE_NAMES[kind], blocks, strict=True)
        },
    }


def _row_norm_means(grads: tuple[Tensor, ...]) -> list[float]:
    # grads[k]: (B, H) -> mean over rows of the per-row L2 norm, listed by distance T-1-k.
    return [float(g.norm(dim=1).mean()) for g in reversed(grads)]


def _default_inputs(cell: nn.RNNCellBase, length: int, batch: int, gen: torch.Generator) -> Tensor:
    w = cell.weight_ih
    noise = torch.randn(batch, length, cell.input_size, generator=gen)  # (B, T, I)
    return noise.to(device=w.device, dtype=w.dtype)


def _default_readout(hidden: int, gen: torch.Generator, like: Tensor) -> Readout:
    u = torch.randn(hidden, generator=gen)
    u = (u / u.norm()).to(device=like.device, dtype=like.dtype)  # (H,) unit direction
    return lambda h: h @ u  # (B,)


def measure_gradient_flow(
    module: nn.Module,
    length: int,
    *,
    inputs: Tensor | None = None,
    readout: Readout | None = None,
    batch_size: int = 64,
    layer: int = 0,
    reverse: bool = False,
    seed: int = 0,
    dtype: torch.dtype | None = torch.float64,
) -> dict[str, Any]:
    """Measure ||dL_T/dh_k|| for k = T..1 on one recurrent layer (or cell).

    Inputs:
      module: nn.RNN/LSTM/GRU (layer `layer`, backward direction if `reverse`) or a cell.
      length: T, the number of steps unrolled.
      inputs: (B, T', I) with T' >= T, the layer's input sequence (for `reverse`, already in the
        backward direction's processing order); default N(0, 1) noise of `batch_size` rows.
      readout: h_T (B, H) -> per-row loss (B,); default <u, h_T> with a fixed random unit u,
        which makes the norms those of u^T dh_T/dh_k.
      seed: seeds the private generator used for the default inputs and readout.
      dtype: unroll a copy of the cell in this dtype (default float64, so that norms far
        below float32's 1e-45 floor stay measurable); None: the module's own dtype, no copy.
    Outputs: dict with distances [0..T-1], norms (mean over rows of ||dL_T/dh_{T-d}||),
      cell_state_norms (LSTM: same for c), decay_rate_per_step, decay_factor_per_step,
      spectral_norm (see `spectral_norms`), cell, length, batch.
    """
    if length < 2:
        raise ValueError(f"length={length} must be >= 2 to measure a decay")
    cell = as_cell(module, layer, reverse)
    if dtype is not None and dtype != cell.weight_hh.dtype:
        cell = copy.deepcopy(cell).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    if inputs is None:
        inputs = _default_inputs(cell, length, batch_size, gen)
    if inputs.dim() != 3 or inputs.shape[1] < length:
        raise ValueError(f"inputs {tuple(inputs.shape)} must be (B, T>={length}, I)")
    inputs = inputs[:, :length].detach().to(cell.weight_hh.dtype)  # (B, T, I)
    with torch.enable_grad():
        hs, cs = unroll(cell, inputs)
        read = readout or _default_readout(cell.hidden_size, gen, hs[-1])
        loss = read(hs[-1]).sum()  # rows are independent: grad of the sum = per-row grads
        states = hs + cs  # h_1..h_T, then c_1..c_T (LSTM)
        raw = torch.autograd.grad(loss, states, allow_unused=True)
    grads = tuple(torch.zeros_like(s) if g is None else g for g, s in zip(raw, states, strict=True))
    norms = _row_norm_means(grads[:length])
    distances = list(range(length))
    rate = fit_decay_rate(distances, norms)
    result: dict[str, Any] = {
        "cell": cell_kind(cell),
        "length": length,
        "batch": int(inputs.shape[0]),
        "distances": distances,
        "norms": norms,
        "decay_rate_per_step": rate,
        "decay_factor_per_step": math.exp(rate) if math.isfinite(rate) else math.nan,
        "spectral_norm": spectral_norms(cell),
    }
    if cs:
        result["cell_state_norms"] = _row_norm_means(grads[length:])
    return result


@dataclass
class GradientFlowMonitor:
    """Call with (step, recurrent layer) every training step; measures every `every_n` steps."""

    every_n: int
    """Measure when step % every_n == 0."""
    length: int = 50
    """Steps unrolled per measurement."""
    out_path: Path | None = None
    """JSONL file each measurement is appended to (None: keep in memory only)."""
    options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for `measure_gradient_flow` (batch_size, layer, reverse, seed)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """Every measurement taken, with its step."""

    def __post_init__(self) -> None:
        if self.every_n < 1:
            raise ValueError(f"every_n={self.every_n} must be >= 1")

    def __call__(
        self, step: int, module: nn.Module, inputs: Tensor | None = None
    ) -> dict[str, Any] | None:
        """Measure at this step if it is due; returns the measurement or None."""
        if step % self.every_n:
            return None
        record = {"step": step, **measure_gradient_flow(module, self.length, inputs=inputs,
                                                        **self.options)}
        self.history.append(record)
        if self.out_path is not None:
            with Path(self.out_path).open("a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return record


def gradient_flow_callback(
    every_n: int, length: int = 50, out_path: Path | str | None = None, **options: Any
) -> GradientFlowMonitor:
    """A training-loop hook: `hook(step, rnn_layer[, inputs])` measures every `every_n` steps."""
    path = Path(out_path) if out_path is not None else None
    return GradientFlowMonitor(every_n=every_n, length=length, out_path=path, options=options)
