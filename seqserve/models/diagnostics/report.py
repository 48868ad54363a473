"""Run the gradient-flow experiment for every cell and write its JSON and two PNG figures.

Files in the output folder:
  gradient_flow.json     schema_version 1: task settings, method notes, per cell and phase
                         (init, trained) the distances, mean norms, decay fit, spectral norms
  gradient_flow.png      ||dL_T/dh_k|| vs T-k on a log scale, one line per cell x phase
  spectral_vs_decay.png  largest singular value of the stacked W_hh vs the fitted decay rate
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from seqserve.models.diagnostics.task import GradientDiagnosticsConfig, run_cell

SCHEMA_VERSION = 1
JSON_NAME = "gradient_flow.json"
FLOW_PNG = "gradient_flow.png"
SPECTRAL_PNG = "spectral_vs_decay.png"
METHOD = {
    "task": "copy-first-token: label = first of T uniform tokens, loss only at step T",
    "norms": "mean over probe rows of the L2 norm of d loss_T / d h_k (per-row loss, summed)",
    "distance": "T - k; distance 0 is h_T itself",
    "decay_rate_per_step": "least-squares slope of ln(norm) vs distance over distances >= 1",
    "decay_factor_per_step": "exp(decay_rate_per_step)",
    "spectral_norm": "largest singular value of weight_hh_l0: 'stacked' is the whole "
    "(G*H, H) matrix (LSTM i,f,g,o; GRU r,z,n), 'gates' each (H, H) block",
    "cell_state_norms": "LSTM only: the same norms for the cell state c_k",
    "init": "PyTorch defaults (LSTM forget bias not raised); 'lstm fb=B' entries: the same "
    "weights with the forget-gate bias set to B (b_ih[f] = B, b_hh[f] = 0)",
    "trained": "after train_steps Adam steps; with curriculum, training lengths ramp 2 -> T "
    "over the first 70% of steps; measured on the same probe batch as init",
    "precision": "model trained in float32; gradients measured in float64 on a copy",
}


def run_gradient_diagnostics(
    cfg: GradientDiagnosticsConfig, out_dir: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Measure every cell in `cfg.cells`, write the three files, return the JSON document."""
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    cells: dict[str, Any] = {}
    for name, cell, forget_bias in cfg.entries():
        log(f"[diagnose] {name}: T={cfg.length} H={cfg.hidden_size} "
            f"train_steps={cfg.train_steps}")
        cells[name] = run_cell(cell, cfg, log, forget_bias)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "config": {**cfg.__dict__, "cells": list(cfg.cells), "embed_size": cfg.input_size,
                   "forget_biases": list(cfg.forget_biases)},
        "method": METHOD,
        "cells": cells,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - start, 2),
    }
    (out_dir / JSON_NAME).write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")
    plot_flow(cells, cfg, out_dir / FLOW_PNG)
    plot_spectral(cells, out_dir / SPECTRAL_PNG)
    log(f"[diagnose] wrote {out_dir / JSON_NAME}, {FLOW_PNG}, {SPECTRAL_PNG} "
        f"({time.perf_counter() - start:.1f}s)")
    return doc


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


COLORS = {"rnn": "tab:red", "lstm": "tab:blue", "gru": "tab:green"}
EXTRA_COLORS = ("tab:purple", "tab:orange", "tab:brown", "tab:cyan", "tab:olive", "tab:pink")
"""Colours of the "lstm fb=B" entries, in order."""


def _colors(names: list[str]) -> dict[str, str]:
    extra = iter(EXTRA_COLORS * (1 + len(names) // len(EXTRA_COLORS)))
    return {n: COLORS.get(n) or next(extra) for n in names}
STYLES = {"init": "--", "trained": "-"}


def plot_flow(cells: dict[str, Any], cfg: GradientDiagnosticsConfig, path: Path) -> None:
    """One log-scale line per cell x phase: mean ||dL_T/dh_k|| against T-k."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = _colors(list(cells))
    for cell, phases in cells.items():
        for phase, m in phases.items():
            pts = [(d, n) for d, n in zip(m["distances"], m["norms"], strict=True) if n > 0]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], STYLES.get(phase, ":"),
                    color=colors[cell], label=f"{cell} {phase} "
                    f"({m['decay_rate_per_step']:+.2f}/step)")
    ax.set_yscale("log")
    ax.set_xlabel("distance T - k (steps)")
    ax.set_ylabel("mean ||dL_T / dh_k||")
    ax.set_title(f"Gradient flow, copy-first-token task (T={cfg.length}, H={cfg.hidden_size})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_spectral(cells: dict[str, Any], path: Path) -> None:
    """Spectral norm of the stacked W_hh vs fitted decay rate; one point per cell x phase, with
    ln(sigma) as the vanilla tanh RNN's upper bound on its rate (|tanh'| <= 1)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    sigmas = []
    colors = _colors(list(cells))
    for cell, phases in cells.items():
        for phase, m in phases.items():
            sigma, rate = m["spectral_norm"]["stacked"], m["decay_rate_per_step"]
            sigmas.append(sigma)
            ax.scatter([sigma], [rate], color=colors[cell],
                       marker="o" if phase == "trained" else "s", label=f"{cell} {phase}")
    if sigmas:
        lo, hi = math.log(min(sigmas) * 0.8), math.log(max(sigmas) * 1.25)
        xs = [math.exp(lo + (hi - lo) * i / 50) for i in range(51)]
        ax.plot(xs, [math.log(x) for x in xs], ":", color="gray",
                label="ln(sigma): tanh-RNN rate bound")
    ax.set_xscale("log")
    ax.set_xlabel("largest singular value of stacked W_hh (weight_hh_l0; LSTM 4H x H, GRU 3H x H)")
    ax.set_ylabel("fitted decay rate per step (slope of ln norm)")
    ax.set_title("Recurrent spectral norm vs observed gradient decay")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
