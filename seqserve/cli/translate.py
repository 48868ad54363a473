"""`seqserve translate`: translate offline through the serving engine (no HTTP).

Loads one translator bundle of a model repository with the chosen runtime, decodes the given
texts with the same `DecodeLoop` the server runs, prints the n-best hypotheses (or JSON)
and can draw the attention heatmap of the first text (matplotlib, Agg backend).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NAME = "translate"
HELP = "Translate texts offline with a translator bundle (same engine as the server)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("texts", nargs="+", help="source sentences")
    parser.add_argument("--repo", type=Path, default=Path("model_repository"),
                        help="model repository folder")
    parser.add_argument("--model", required=True, help="translator name in the repository")
    parser.add_argument("--version", type=int, default=None, help="default: the highest")
    parser.add_argument("--runtime", choices=["onnx", "torchscript"], default="onnx")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    # Search options left out take the server's defaults (one table: scheduling.search).
    parser.add_argument("--beam-size", type=int, default=None,
                        help="default: the server's (1 if sampling)")
    parser.add_argument("--n-best", type=int, default=None)
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--max-length-ratio", type=float, default=None)
    parser.add_argument("--min-length", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None, help="GNMT alpha")
    parser.add_argument("--coverage-penalty", type=float, default=None, help="GNMT beta")
    parser.add_argument("--no-repeat-ngram-size", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None, help="turns sampling on")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    parser.add_argument("--plot", type=Path, default=None,
                        help="write the first text's attention heatmap (PNG) here")


def run(args: argparse.Namespace) -> int:
    import asyncio

    from pydantic import ValidationError

    from seqserve.models.errors import UserError
    from seqserve.service.api.common import describe_errors
    from seqserve.service.api.translate import TranslateOptions

    fields = ("beam_size", "n_best", "max_length", "max_length_ratio", "min_length",
              "length_penalty", "coverage_penalty", "no_repeat_ngram_size", "temperature",
              "top_k", "top_p", "seed")
    given = {f: getattr(args, f) for f in fields if getattr(args, f) is not None}
    try:
        options = TranslateOptions(**given, return_attention=args.plot is not None)
    except ValidationError as exc:
        raise UserError(describe_errors(exc.errors(), flags=True)) from exc
    answer = asyncio.run(_translate(args, options.search_options()))
    if args.json:
        json.dump(answer, sys.stdout, indent=2, ensure_ascii=False)
        print()
    else:
        _print(answer)
    if args.plot is not None:
        attention = answer["results"][0].get("attention")
        if attention:
            plot_attention(attention, args.plot, answer.get("decoder"))
            print(f"attention heatmap -> {args.plot}", file=sys.stderr)
    return 0


async def _translate(args: argparse.Namespace, options: Any) -> dict[str, Any]:
    """Load the model through the server's repository and translate with its worker."""
    import time

    from seqserve.models.errors import UserError
    from seqserve.service.core.errors import ServiceError
    from seqserve.service.core.metrics import Metrics
    from seqserve.service.server.composition import Composition
    from seqserve.service.web.settings import Settings
    from seqserve.service.workers.base import RequestContext
    from seqserve.service.workers.translator import TranslatorWorker

    settings = Settings(repo=args.repo, runtime=args.runtime, device=args.device,
                        warmup=False, truncate=True)
    composition = Composition(settings, Metrics())
    await composition.start(only=args.model)
    repo = composition.repository
    try:
        entry, worker = repo.worker(args.model, args.version, TranslatorWorker)
        m = entry.manifest
        if m and not m.has_attention and (options.return_attention or options.coverage_penalty):
            raise UserError(f"model {args.model!r} v{entry.version} has no attention (decoder "
                            f"{m.decoder!r}: fixed context): drop --plot and "
                            "--coverage-penalty")
        started = time.perf_counter()
        results = await worker.translate(list(args.texts), options,
                                         RequestContext(deadline=time.monotonic() + 3600.0))
        seconds = time.perf_counter() - started
    except ServiceError as exc:
        raise UserError(f"{args.repo}: {exc.message}") from exc
    finally:
        await composition.stop(60.0)
    decoder = entry.manifest.decoder if entry.manifest else None
    return {"model": args.model, "version": entry.version, "decoder": decoder or "luong",
            "seconds": round(seconds, 4), "results": results}


def _print(answer: dict[str, Any]) -> None:
    for result in answer["results"]:
        print(result["translation"])
        if len(result["hypotheses"]) > 1:
            for i, h in enumerate(result["hypotheses"], 1):
                print(f"  {i}. {h['score']:9.4f}  {h['translation']}")


ROW_MEANING = {
    "bahdanau": "row t: aligned from s(t-1),\nbefore target token t is emitted",
    "luong": "row t: aligned from h(t),\nthe state that emits target token t",
}


def plot_attention(attention: dict[str, Any], out: Path, decoder: str | None = None) -> Path:
    """Heatmap of target x source attention weights, tokens on the axes (PNG); the title says
    which state each row's alignment was computed from (ROW_MEANING)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    weights = np.array(attention["weights"])  # (T, S)
    src, tgt = attention["source_tokens"], attention["target_tokens"]
    size = (max(4.0, 1.5 + 0.5 * len(src)), max(3.0, 1.0 + 0.35 * len(tgt)))
    fig, ax = plt.subplots(figsize=size)
    image = ax.imshow(weights, cmap="viridis", aspect="auto", vmin=0.0, vmax=1.0)
    ax.set_xticks(range(len(src)), src, rotation=60, ha="right")
    ax.set_yticks(range(len(tgt)), tgt)
    ax.set_xlabel("source tokens")
    ax.set_ylabel("target tokens")
    if decoder in ROW_MEANING:
        ax.set_title(f"{decoder} attention, {ROW_MEANING[decoder]}", fontsize=8)
    fig.colorbar(image, ax=ax, fraction=0.05)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
