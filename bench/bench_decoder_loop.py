"""Benchmark (not a test): the translator's teacher-forced training step per decoder, and
the ways to run the stepwise recurrence that Bahdanau and Luong input feeding need.

One forward + backward of a padded batch (median of --repeats after 5 warm-up rounds; the
cases run round robin, so a change in machine load hits all of them alike), side by side:

- luong one-shot:   today's order, the RNN over the whole target in one call (the reference)
- luong stepped:    the same model pushed through the step loop (`decoders.step` per t):
                    the cost of looping alone
- luong+feeding, bahdanau: the step loop as trained (`decoders.run`: the nn.GRU/LSTM/RNN
                    module stepped one position at a time, the code decode_step runs)
- bahdanau scripted: the same Bahdanau recurrence as one TorchScript function over time
                    (`torch.gru_cell`, GRU, one layer), the alternative to the module loop
- none one-shot:    the fixed-context decoder (its context is known up front)

    .venv/bin/python bench/bench_decoder_loop.py                    # demo sizes (H 256)
    .venv/bin/python bench/bench_decoder_loop.py --hidden 64 --embed 32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqserve.models.config import TranslatorConfig  # noqa: E402
from seqserve.models.nn import decoders  # noqa: E402
from seqserve.models.nn.decoders import Memory, StepOut  # noqa: E402
from seqserve.models.nn.translator import Translator  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--src-len", type=int, default=10, help="source tokens (demo: <= 10 words)")
    p.add_argument("--tgt-len", type=int, default=12, help="target tokens incl. bos")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--embed", type=int, default=128)
    p.add_argument("--vocab", type=int, default=450, help="demo word vocabulary ~450")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)

    @torch.jit.script
    def _bahdanau_gru_loop(y: Tensor, h: Tensor, keys: Tensor, memory: Tensor, mask: Tensor,
                           w_q: Tensor, v: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor,
                           b_hh: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """y (B, T, E), h (B, H), keys (B, S, A) -> s (B, T, H), c (B, T, D), h (B, H)."""
        outs: list[Tensor] = []
        ctxs: list[Tensor] = []
        for t in range(y.shape[1]):
            q = torch.matmul(h, w_q.t()).unsqueeze(1)  # (B, 1, A)
            scores = torch.matmul(torch.tanh(q + keys), v.t()).squeeze(-1)  # (B, S)
            a = torch.softmax(scores.masked_fill(~mask, -1e9), -1)  # (B, S)
            c = torch.bmm(a.unsqueeze(1), memory).squeeze(1)  # (B, D)
            h = torch.gru_cell(torch.cat([y[:, t], c], -1), h, w_ih, w_hh, b_ih, b_hh)
            outs.append(h)
            ctxs.append(c)
        return torch.stack(outs, 1), torch.stack(ctxs, 1), h


def _scripted_bahdanau(model: Translator) -> Callable[..., StepOut]:
    """`decoders.run` replacement for a 1-layer GRU Bahdanau model (the scripted loop)."""
    def run(parts: object, y: Tensor, hidden: Tensor, extra: Tensor | None,
            mem: Memory) -> StepOut:
        att, rnn = model.attention, model.decoder
        assert att is not None and mem.keys is not None
        s, c, h = _bahdanau_gru_loop(
            y, hidden[0], mem.keys, mem.memory, mem.mask, att.query_proj.weight,
            att.score.weight, rnn.weight_ih_l0, rnn.weight_hh_l0, rnn.bias_ih_l0,
            rnn.bias_hh_l0)
        o = torch.tanh(model.combine(torch.cat([s, c, y], -1)))  # (B, T, H)
        return StepOut(o, h.unsqueeze(0), None, c)

    return run


def _stepped(parts: object, y: Tensor, hidden: object, extra: Tensor | None,
             mem: Memory) -> StepOut:
    """`decoders.run` that always loops, even where one RNN call would do."""
    outs = []
    for t in range(y.shape[1]):
        result = decoders.step(parts, y[:, t], hidden, extra, mem)  # type: ignore[arg-type]
        hidden, extra = result.hidden, result.extra
        outs.append(result.out)
    return StepOut(torch.stack(outs, 1), hidden, extra, outs[0])  # type: ignore[arg-type]


def _agrees(model: Translator, batch: tuple[Tensor, ...], run: Callable[..., StepOut]) -> bool:
    """The variant's eval-mode logits equal those of `decoders.run` (1e-4)."""
    model.eval()
    with torch.no_grad():
        expected, _ = model(*batch[:3])
        original = decoders.run
        decoders.run = run  # type: ignore[assignment]
        try:
            got, _ = model(*batch[:3])
        finally:
            decoders.run = original
    return bool(torch.allclose(got, expected, atol=1e-4))


def _step_once(model: Translator, batch: tuple[Tensor, ...],
               run: Callable[..., StepOut]) -> float:
    """Seconds of one forward + backward with `run` as the teacher-forced decoder."""
    original = decoders.run
    decoders.run = run  # type: ignore[assignment]
    try:
        start = time.perf_counter()
        _, loss = model(*batch)
        assert loss is not None
        loss.backward()
        return time.perf_counter() - start
    finally:
        decoders.run = original


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    b, s, t, v = args.batch, args.src_len, args.tgt_len, args.vocab
    src = torch.randint(4, v, (b, s))
    lengths = torch.randint(max(1, s // 2), s + 1, (b,))
    lengths[0] = s
    src = src.masked_fill(torch.arange(s)[None] >= lengths[:, None], 0)
    batch = (src, lengths, torch.randint(4, v, (b, t)), torch.randint(4, v, (b, t)))
    base = {"vocab_size": v, "hidden_size": args.hidden, "embed_size": args.embed,
            "cell": "gru", "dropout": 0.1}
    cases: list[tuple[str, dict[str, object], Callable[..., StepOut]]] = [
        ("luong one-shot (today)", {"decoder": "luong"}, decoders.run),
        ("luong stepped", {"decoder": "luong"}, _stepped),
        ("luong+feeding stepped", {"decoder": "luong", "input_feeding": True}, decoders.run),
        ("bahdanau stepped", {"decoder": "bahdanau"}, decoders.run),
        ("bahdanau scripted", {"decoder": "bahdanau"}, None),  # type: ignore[list-item]
        ("none one-shot", {"decoder": "none", "attention": "none"}, decoders.run),
    ]
    print(f"fwd+bwd per batch, median of {args.repeats}: B={b} S={s} T={t} E={args.embed} "
          f"H={args.hidden} V={v}, GRU, {args.threads} thread(s)")
    built = []
    for name, overrides, run in cases:
        model = Translator(TranslatorConfig(**{**base, **overrides}))  # type: ignore[arg-type]
        run = run or _scripted_bahdanau(model)
        agrees = _agrees(model, batch, run)  # in eval mode
        built.append((name, model.train(), run, agrees))
    times: dict[str, list[float]] = {name: [] for name, *_ in built}
    for i in range(args.repeats + 5):  # round robin: load changes hit every case alike
        for name, model, run, _ in built:
            seconds = _step_once(model, batch, run)
            if i >= 5:
                times[name].append(seconds)
    reference = statistics.median(times[built[0][0]])
    for name, _, _, same in built:
        ms = statistics.median(times[name]) * 1e3
        agree = "same logits" if same else "LOGITS DIFFER"
        print(f"  {name:24} {ms:8.2f} ms   x{ms / (reference * 1e3):5.2f}   ({agree})")


if __name__ == "__main__":
    main()
