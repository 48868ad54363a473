"""`seqserve diagnose gradients`: gradient-flow diagnostics of RNN/LSTM/GRU cells.

Measures ||dL_T/dh_k|| against T-k on the copy-first-token task at initialisation and after a
short training run, and writes gradient_flow.json, gradient_flow.png and spectral_vs_decay.png
to --out (see models/diagnostics/report.py). `--forget-bias 1 2` adds LSTM entries with the
forget-gate bias set to 1 and 2 at init (otherwise the same weights), showing its effect on
gradient flow.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seqserve.models.errors import UserError

NAME = "diagnose"
HELP = "Diagnostics of recurrent models (gradients: vanishing/exploding gradient flow)."
CELLS = ("rnn", "lstm", "gru")


def _cells(value: str) -> list[str]:
    cells = [c.strip().lower() for c in value.split(",") if c.strip()]
    bad = [c for c in cells if c not in CELLS]
    if not cells or bad:
        raise argparse.ArgumentTypeError(f"{value!r}: cells are {', '.join(CELLS)}")
    return cells


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="diagnostic", metavar="DIAGNOSTIC")
    sub.required = True
    grad = sub.add_parser(
        "gradients",
        help="||dL_T/dh_k|| vs distance per cell, at init and after a short training run.",
    )
    grad.add_argument("--cell", type=_cells, nargs="+", default=[list(CELLS)],
                      help="cells, comma- or space-separated (default: rnn,lstm,gru)")
    grad.add_argument("--length", type=int, default=60, help="sequence length T (default 60)")
    grad.add_argument("--hidden", type=int, default=64, help="hidden size H (default 64)")
    grad.add_argument("--embed", type=int, default=0, help="input width E (default: = H)")
    grad.add_argument("--vocab", type=int, default=8, help="task symbols V (default 8)")
    grad.add_argument("--train-steps", type=int, default=300,
                      help="Adam steps of the training run (default 300; 0 = init only)")
    grad.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    grad.add_argument("--no-curriculum", action="store_true",
                      help="train at length T from the first step (default: lengths 2 -> T)")
    grad.add_argument("--probe-batch", type=int, default=128, help="rows averaged over")
    grad.add_argument("--seed", type=int, default=0)
    grad.add_argument("--forget-bias", type=float, nargs="+", default=[], metavar="B",
                      help="also measure the LSTM with its forget-gate bias set to each B "
                           "(same weights otherwise; entries 'lstm fb=B')")
    # One thread by default: the ops are tiny (B=64, H=64), and on the shared 2-core machine
    # 2 threads ran the default command in 252 s against 18 s for 1 (OpenMP contention).
    grad.add_argument("--threads", type=int, default=1,
                      help="torch CPU threads (default 1; the small ops gain nothing from more)")
    grad.add_argument("--out", type=Path, required=True, help="output folder")


def run(args: argparse.Namespace) -> int:
    import torch

    from seqserve.models.diagnostics.report import run_gradient_diagnostics
    from seqserve.models.diagnostics.task import GradientDiagnosticsConfig

    cells = tuple(dict.fromkeys(c for group in args.cell for c in group))
    try:
        cfg = GradientDiagnosticsConfig(
            cells=cells, length=args.length, hidden_size=args.hidden, embed_size=args.embed,
            vocab_size=args.vocab, train_steps=args.train_steps, lr=args.lr,
            probe_batch=args.probe_batch, seed=args.seed,
            curriculum=not args.no_curriculum, forget_biases=tuple(args.forget_bias),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if args.threads < 1:
        raise UserError(f"--threads {args.threads} must be >= 1")
    torch.set_num_threads(args.threads)
    doc = run_gradient_diagnostics(cfg, args.out)
    width = max(5, *(len(name) for name in doc["cells"]))
    print(f"{'cell':{width}} {'phase':8} {'decay/step':>10} {'factor':>7} {'norm@far':>10} "
          f"{'sigma':>6}")
    for cell, phases in doc["cells"].items():
        for phase, m in phases.items():
            at = m["norm_at_distance"]
            far = at[max(at, key=int)] if at else float("nan")
            print(f"{cell:{width}} {phase:8} {m['decay_rate_per_step']:>+10.3f} "
                  f"{m['decay_factor_per_step']:>7.3f} {far:>10.2e} "
                  f"{m['spectral_norm']['stacked']:>6.3f}")
    return 0
