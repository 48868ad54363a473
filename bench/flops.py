"""Model FLOP counts (analytic, from a bundle's run config) and this machine's fp32 sgemm peak.

    .venv/bin/python bench/flops.py --repo model_repository --threads 1 [--json OUT.json]

Counting rules (multiply-add = 2 FLOPs; element-wise ops, softmax, top-k are not counted):
- embeddings are free (a gather);
- a recurrent layer per token and direction: 2*in*G*H (input gates) + 2*H*G*H (recurrent
  gates), G = 4 for LSTM, 3 for GRU, 1 for a plain RNN;
- classifier: attention pooling per token (additive: 2*D*A + 2*A score + 2*D weighted sum),
  head per sequence (2*D*head + 2*head*classes);
- translator: encoder per source token, bridge per sentence, and per decoder row-step (one
  hypothesis, one step) the decoder cell, the attention query projection, per source token the
  key projection (a schema 2 `decoder_step` projects the memory once per request per step and
  shares it among the request's beam rows: "executed" charges each row 1/beam of it; schema 3
  exports project it once per request in the encoder, the "minimal" count), the score and the
  context, then combine (2*(H+mem)*H) and the output layer (2*H*V).

The peak is the best rate of a large fp32 matrix multiply (n x n, 2*n^3 FLOPs) on the given
number of threads (the thread count the server's runtime uses), the better of ONNX Runtime's
MatMul (MLAS) and torch.mm (MKL).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GATES = {"lstm": 4, "gru": 3, "rnn": 1}


def rnn_layer_flops(cell: str, inp: int, hidden: int, proj: int = 0) -> int:
    """FLOPs per token of one direction of one recurrent layer (input + recurrent gates)."""
    g = GATES[cell]
    h_out = proj or hidden  # what is fed back (LSTM projection)
    flops = 2 * inp * g * hidden + 2 * h_out * g * hidden
    if proj:
        flops += 2 * hidden * proj
    return flops


def rnn_stack_flops(cell: str, inp: int, hidden: int, layers: int, directions: int,
                    proj: int = 0) -> int:
    """FLOPs per token of a (bi)RNN stack; layer l > 0 reads the directions' outputs."""
    out = (proj or hidden) * directions
    total = 0
    for layer in range(layers):
        total += directions * rnn_layer_flops(cell, inp if layer == 0 else out, hidden, proj)
    return total


def classifier_flops(cfg: dict[str, Any]) -> dict[str, int]:
    """per_token (recurrent stack + attention pooling) and per_sequence (head)."""
    d = 2 if cfg.get("bidirectional", True) else 1
    proj = int(cfg.get("proj_size") or 0)
    h = int(cfg["hidden_size"])
    size = (proj or h) * d
    rnn = rnn_stack_flops(cfg["cell"], int(cfg["embed_size"]), h, int(cfg["num_layers"]), d,
                          proj)
    kind = cfg.get("attention", "additive")
    if kind == "additive":
        a = size // 2
        pool = 2 * size * a + 2 * a + 2 * size
    elif kind == "general":
        pool = 2 * size * size + 2 * size + 2 * size
    else:
        pool = 2 * size + 2 * size
    head = 2 * size * int(cfg["head_size"]) + 2 * int(cfg["head_size"]) * int(cfg["num_labels"])
    return {"rnn_per_token": rnn, "pool_per_token": pool, "per_token": rnn + pool,
            "per_sequence": head}


def translator_flops(cfg: dict[str, Any], beam: int = 5) -> dict[str, int]:
    """Encoder per source token, bridge per sentence, decoder per row-step (fixed part and the
    part per source token, executed and minimal), key projection once per source token."""
    bi = bool(cfg.get("bidirectional", True))
    d = 2 if bi else 1
    h = int(cfg["hidden_size"])
    layers = int(cfg["num_layers"])
    proj = int(cfg.get("proj_size") or 0)
    enc_h = h // 2 if bi else h
    mem = (proj or enc_h) * d
    e = int(cfg["embed_size"])
    v = int(cfg["vocab_size"])
    cell = cfg["cell"]
    encoder = rnn_stack_flops(cell, e, enc_h, layers, d, proj)
    bridge = 2 * (layers * mem) * (layers * h) * (2 if cell == "lstm" else 1)
    dec_cell = sum(rnn_layer_flops(cell, e if i == 0 else h, h) for i in range(layers))
    kind = cfg.get("attention", "additive")
    if kind == "additive":
        query, key, per_src = 2 * h * h, 2 * mem * h, 2 * h + 2 * mem
    elif kind == "general":
        query, key, per_src = 0, 2 * mem * h, 2 * h + 2 * mem
    else:
        query, key, per_src = 0, 0, 2 * h + 2 * mem
    fixed = dec_cell + query + 2 * (h + mem) * h + 2 * h * v
    return {"encoder_per_src_token": encoder, "bridge_per_sentence": bridge,
            "step_fixed": fixed, "step_per_src_executed": key // beam + per_src,
            "step_per_src_minimal": per_src, "key_proj_per_src_token": key}


def translation_flops(f: dict[str, int], src_tokens: float, row_steps: float,
                      executed: bool = True) -> float:
    """FLOPs of one request: encoder over its source, bridge, and `row_steps` decoder rows."""
    per_src = f["step_per_src_executed"] if executed else f["step_per_src_minimal"]
    enc = src_tokens * f["encoder_per_src_token"] + f["bridge_per_sentence"]
    if not executed:
        enc += src_tokens * f["key_proj_per_src_token"]
    return enc + row_steps * (f["step_fixed"] + src_tokens * per_src)


def _best(fn: Any, seconds: float) -> tuple[float, int]:
    """Shortest time of fn() over `seconds` (at least 3 runs) and the run count."""
    fn()
    best, runs, start = float("inf"), 0, time.perf_counter()
    while time.perf_counter() - start < seconds or runs < 3:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best, runs


def ort_matmul(n: int, threads: int) -> Any:
    """A one-node ONNX MatMul session (n x n fp32) on `threads` intra-op threads."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    spec = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "abc"]
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
                              spec[:2], spec[2:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    a = np.random.default_rng(0).random((n, n), dtype=np.float32)
    feed = {"a": a, "b": a.copy()}
    return lambda: sess.run(None, feed)


def measure_peak(threads: int, n: int = 2048, seconds: float = 3.0) -> dict[str, Any]:
    """Best fp32 sgemm rate (FLOP/s) of n x n @ n x n on `threads` threads, per library:
    ONNX Runtime's MatMul (MLAS, what the onnx runtime computes with) and torch.mm (MKL, the
    torchscript runtime's). The peak is the better of the two: on AMD CPUs MKL takes a slower
    path than MLAS, so torch alone understates what the core can do."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    out = torch.empty(n, n)
    by_lib: dict[str, float] = {}
    for lib, fn in (("onnxruntime", ort_matmul(n, threads)),
                    ("torch", lambda: torch.mm(a, b, out=out))):
        best, _ = _best(fn, seconds / 2)
        by_lib[lib] = 2 * n**3 / best
    return {"threads": threads, "n": n, "flops_per_s": max(by_lib.values()), "by_lib": by_lib}


def mean_tokens(bundle: Path, jsonl: Path, field: str) -> float:
    """Mean tokenizer length of `field` over a JSONL split, with the bundle's tokenizer."""
    from seqserve.export.manifest import load_bundle
    from seqserve.models.text.tokenizer import Tokenizer

    tok = Tokenizer.load(bundle / load_bundle(bundle).tokenizer.file)
    rows = [json.loads(line) for line in jsonl.open(encoding="utf-8") if line.strip()]
    return sum(len(tok.encode(str(r[field]))) for r in rows) / len(rows)


def model_config(bundle: Path) -> dict[str, Any]:
    manifest = json.loads((bundle / "manifest.json").read_text())
    return dict(manifest["source_run"]["config"]["model"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=ROOT / "model_repository")
    p.add_argument("--classifier", default="langid")
    p.add_argument("--translator", default="numbers-en-fr")
    p.add_argument("--data", type=Path, default=ROOT / "data")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    out: dict[str, Any] = {"peak": []}
    for t in args.threads:
        peak = measure_peak(t, seconds=args.seconds)
        out["peak"].append(peak)
        libs = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in peak["by_lib"].items())
        print(f"fp32 sgemm peak, {t} thread(s): {peak['flops_per_s'] / 1e9:.1f} GFLOP/s "
              f"(n={peak['n']}; {libs})", flush=True)
    clf = args.repo / args.classifier / "1"
    clf_cfg = model_config(clf)
    out["classifier"] = {"config": clf_cfg, "flops": classifier_flops(clf_cfg),
                         "mean_tokens_test": mean_tokens(clf, args.data / args.classifier /
                                                         "test.jsonl", "text")}
    tr = args.repo / args.translator / "1"
    tr_cfg = model_config(tr)
    out["translator"] = {"config": tr_cfg, "flops": translator_flops(tr_cfg),
                         "mean_src_tokens_test": mean_tokens(tr, args.data / args.translator /
                                                             "test.jsonl", "source")}
    for name in ("classifier", "translator"):
        print(f"{name}: {json.dumps(out[name]['flops'])}")
    print(f"classifier test split: {out['classifier']['mean_tokens_test']:.1f} tokens/text; "
          f"translator: {out['translator']['mean_src_tokens_test']:.1f} source tokens/sentence")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
