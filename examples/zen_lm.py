"""A character-level LSTM language model of the Zen of Python, served by seqserve.

The model of PyTorch's word_language_model example (`RNNModel`: embedding, nn.LSTM over
(seq, batch) input, a linear decoder, log-softmax flattened to (seq*batch, ntoken),
`init_hidden`), written the way that example writes it, at character level: its own
vocabulary (every character, lower-cased, and "<eos>" at each line's end, saved as a Hugging
Face `tokenizer.json`), trained with truncated BPTT in a few seconds on the Zen of Python
(`import this`, shipped with CPython).

    python examples/zen_lm.py --out work/zen
        trains, then writes work/zen/tokenizer.json, lm.onnx (torch.onnx.export of
        forward(input, hidden) with dynamic seq and batch axes and our own tensor names: the
        one file is both the prefill and the step graph) and weights.pt (the state dict)
    python examples/zen_lm.py --out work/zen --repo model_repository --name zen-py
        also packs the trained module with seqserve's Python API (seqserve.pack.lm)

"<eos>" is both the token every prompt is read after (bos) and the one that ends generation
(eos), as in the example's corpus, where it separates lines:
    seqserve pack lm --prefill work/zen/lm.onnx --step work/zen/lm.onnx \\
        --tokenizer work/zen/tokenizer.json --bos-token "<eos>" --name zen
"""

from __future__ import annotations

import argparse
import codecs
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

EOS = "<eos>"


def zen_lines() -> list[str]:
    """The Zen of Python's aphorisms, lower-cased (`this.s` is its ROT13 text)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        import this
    text = codecs.decode(this.s, "rot13")
    return [line.strip().lower() for line in text.splitlines()[2:] if line.strip()]


def build_tokenizer(lines: list[str], path: Path) -> None:
    """One id per character, "<pad>" 0, "<unk>" 1, "<eos>" 2."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    chars = sorted({c for line in lines for c in line})
    vocab = {"<pad>": 0, "<unk>": 1, EOS: 2} | {c: i + 3 for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # every character a token
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<unk>", EOS])
    tok.save(str(path))


class RNNModel(nn.Module):
    """The word_language_model example's model (LSTM or GRU)."""

    def __init__(self, rnn_type: str, ntoken: int, ninp: int, nhid: int, nlayers: int,
                 dropout: float = 0.1) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout if nlayers > 1
                                         else 0.0)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def forward(self, input: Tensor, hidden: Tensor | tuple[Tensor, Tensor]
                ) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> Tensor | tuple[Tensor, Tensor]:
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def repackage(h: Tensor | tuple[Tensor, ...]) -> Tensor | tuple[Tensor, ...]:
    return h.detach() if isinstance(h, Tensor) else tuple(repackage(v) for v in h)


def train(out: Path, steps: int = 300, seed: int = 0) -> RNNModel:
    """The example's training loop: the corpus as (seq, batch) streams, bptt chunks."""
    from tokenizers import Tokenizer

    torch.manual_seed(seed)
    lines = zen_lines()
    build_tokenizer(lines, out / "tokenizer.json")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    ids = [i for line in lines for i in [*tok.encode(line).ids, eos]]
    batch, bptt = 8, 32
    width = len(ids) // batch
    data = torch.tensor(ids[:width * batch]).view(batch, width).t().contiguous()  # (T, B)
    model = RNNModel("LSTM", tok.get_vocab_size(), 32, 128, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    started = time.perf_counter()
    hidden = model.init_hidden(batch)
    step = 0
    while step < steps:
        for i in range(0, width - 1, bptt):
            seq = min(bptt, width - 1 - i)
            x, y = data[i:i + seq], data[i + 1:i + 1 + seq].reshape(-1)
            hidden = repackage(hidden)
            output, hidden = model(x, hidden)
            loss = F.nll_loss(output, y)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            step += 1
        hidden = model.init_hidden(batch)
    print(f"trained in {time.perf_counter() - started:.1f} s: {step} steps, last training "
          f"loss {float(loss):.2f} nats per character")
    model.eval()
    torch.save(model.state_dict(), out / "weights.pt")
    return model


def export(model: RNNModel, out: Path) -> None:
    """What a user has before seqserve: forward(input, hidden) in one ONNX file."""
    ids = torch.randint(3, model.ntoken, (7, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids, model.init_hidden(3)), str(out / "lm.onnx"),
                          input_names=["input_ids", "h0", "c0"],
                          output_names=["logits", "hn", "cn"],
                          dynamic_axes={"input_ids": {0: "seq", 1: "batch"},
                                        "h0": {1: "batch"}, "c0": {1: "batch"},
                                        "logits": {0: "seq_batch"}, "hn": {1: "batch"},
                                        "cn": {1: "batch"}},
                          opset_version=17, dynamo=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("work/zen"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repo", type=Path, default=None,
                    help="also pack the module into this model repository (Python API)")
    ap.add_argument("--name", default="zen-py")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    model = train(args.out, args.steps)
    export(model, args.out)
    print(f"wrote {args.out}/tokenizer.json, lm.onnx, weights.pt")
    if args.repo is not None:
        import seqserve.pack

        bundle = seqserve.pack.lm(model, tokenizer=args.out / "tokenizer.json",
                                  specials={"bos": EOS}, repo=args.repo, name=args.name)
        print(f"packed {bundle}")


if __name__ == "__main__":
    main()
