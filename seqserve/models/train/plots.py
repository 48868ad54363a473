"""Training curves as a PNG (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

QUALITY_KEYS = ("accuracy", "macro_f1", "token_accuracy", "exact_match", "chrf", "bleu")


def epoch_figure(panels: int, width: float, height: float = 3.6) -> tuple[Any, Any, Any]:
    """A row of `panels` per-epoch charts on the Agg backend: (pyplot, figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(width, height))
    return plt, fig, axes


def plot_keys(ax: Any, history: list[dict[str, Any]], keys: tuple[str, ...],
              marker: str = "o") -> None:
    """One line per key of the metrics rows over their epochs, labelled with the key."""
    epochs = [row["epoch"] for row in history]
    for key in keys:
        ax.plot(epochs, [row.get(key) for row in history], marker=marker, label=key)


def save_epoch_figure(plt: Any, fig: Any, axes: Any, path: str | Path,
                      legend: bool = False, fontsize: int = 7) -> None:
    """Label every chart's x axis (epochs), add legends where asked, write the PNG."""
    for ax in axes:
        ax.set_xlabel("epoch")
        if legend and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=fontsize)
    fig.tight_layout()
    fig.savefig(str(path), dpi=80)
    plt.close(fig)


def plot_curves(history: list[dict[str, Any]], path: str | Path) -> None:
    """Losses, validation quality (fractions; chrF/BLEU scaled to 0-1) and per-layer gradient
    norms per epoch, from the rows of metrics.json."""
    plt, fig, axes = epoch_figure(3, 15, 4)
    epochs = [row["epoch"] for row in history]
    plot_keys(axes[0], history, ("train_loss", "valid_loss"))
    axes[0].set_title("loss")
    for key in QUALITY_KEYS:
        values = [row.get(f"valid_{key}") for row in history]
        if any(v is not None for v in values):
            scale = 0.01 if key in ("chrf", "bleu") else 1.0
            axes[1].plot(epochs, [v * scale if v is not None else None for v in values],
                         marker="o", label=key + (" / 100" if scale != 1.0 else ""))
    axes[1].set_title("validation")
    layers = sorted({k for row in history for k in row.get("grad_norm", {})})
    for layer in layers:
        axes[2].plot(epochs, [row.get("grad_norm", {}).get(layer) for row in history],
                     label=layer)
    axes[2].set_yscale("log")
    axes[2].set_title("mean gradient norm per layer")
    save_epoch_figure(plt, fig, axes, path, legend=True, fontsize=6)
