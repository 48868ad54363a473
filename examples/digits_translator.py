"""Reading digits aloud with a GRU encoder and a Bahdanau-attention GRU decoder, served by
seqserve.

The models of PyTorch's "NLP from scratch: translation with a sequence to sequence network
and attention" tutorial (EncoderRNN, BahdanauAttention, AttnDecoderRNN), written the way
that tutorial writes them, with separate source and target vocabularies (two tokenizer.json
files built with the `tokenizers` library): characters "0".."9" in, the words "zero".."nine"
out ("2024" -> "two zero two four"), trained in a few seconds on generated numbers.

    python examples/digits_translator.py --out work/digits
        trains, then writes work/digits/source.json, target.json, encoder.onnx and
        decoder.onnx (torch.onnx.export of the encoder and of one decoder step, our own tensor
        names) and weights.pt (both state dicts)
    python examples/digits_translator.py --out work/digits --repo model_repository --name digits-py
        also packs the trained modules with seqserve's Python API (seqserve.pack.translator)

The decoder step is exported as it is: (previous token, hidden, encoder outputs, mask) ->
(logits over the target vocabulary, new hidden, attention weights). `seqserve pack translator`
adds what the server's batched beam search needs (log-softmax + top-k, memory rows gathered
per hypothesis, the state flattened); see docs/own-model/index.md ("Serve your own model").
"""

from __future__ import annotations

import argparse
import random
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
SOS, EOS = 2, 3  # "<s>" and "</s>" in the target vocabulary below


def build_tokenizers(out: Path) -> None:
    """Source: one id per digit ("<pad>" 0, "<unk>" 1). Target: one id per word ("<pad>",
    "<unk>", "<s>", "</s>", then the words), decoded with spaces between words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    src = {"<pad>": 0, "<unk>": 1} | {str(d): d + 2 for d in range(10)}
    tok = Tokenizer(models.WordLevel(src, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Split("", "isolated")])
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<unk>"])
    tok.save(str(out / "source.json"))
    tgt = {t: i for i, t in enumerate(["<pad>", "<unk>", "<s>", "</s>", *WORDS])}
    tok = Tokenizer(models.WordLevel(tgt, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<pad>", "<unk>", "<s>", "</s>"])
    tok.save(str(out / "target.json"))


class EncoderRNN(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden, padding_idx=0)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)

    def forward(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        outputs, _ = self.gru(self.embedding(ids))  # (batch, src_len, hidden)
        last = outputs[torch.arange(outputs.shape[0]), lengths - 1]  # padding comes after it
        return outputs, last.unsqueeze(0)  # encoder outputs, hidden (1, batch, hidden)


class BahdanauAttention(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.Wa = nn.Linear(hidden, hidden)
        self.Ua = nn.Linear(hidden, hidden)
        self.Va = nn.Linear(hidden, 1)

    def forward(self, query: Tensor, keys: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(-1)  # (B, S)
        weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        return torch.bmm(weights.unsqueeze(1), keys), weights  # context (B, 1, H), (B, S)


class AttnDecoderRNN(nn.Module):
    """One decoder step: attend from the previous hidden state, feed [embedding; context]."""

    def __init__(self, hidden: int, vocab_size: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, hidden)
        self.attention = BahdanauAttention(hidden)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, prev: Tensor, hidden: Tensor, encoder_outputs: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        embedded = self.embedding(prev).unsqueeze(1)  # (B, 1, H)
        context, weights = self.attention(hidden[-1].unsqueeze(1), encoder_outputs, mask)
        output, hidden = self.gru(torch.cat([embedded, context], dim=-1), hidden)
        return self.out(output.squeeze(1)), hidden, weights  # logits (B, V), (1, B, H), (B, S)


def pad(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return ids, lengths


def pairs(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """Generated numbers of 1 to 6 digits and their digits read aloud."""
    out = []
    for _ in range(n):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 6)))
        out.append((digits, " ".join(WORDS[int(d)] for d in digits)))
    return out


def train(out: Path, steps: int = 200, hidden: int = 48, seed: int = 0
          ) -> tuple[EncoderRNN, AttnDecoderRNN]:
    from tokenizers import Tokenizer

    rng = random.Random(seed)
    torch.manual_seed(seed)
    build_tokenizers(out)
    src_tok = Tokenizer.from_file(str(out / "source.json"))
    tgt_tok = Tokenizer.from_file(str(out / "target.json"))
    encoder = EncoderRNN(src_tok.get_vocab_size(), hidden)
    decoder = AttnDecoderRNN(hidden, tgt_tok.get_vocab_size())
    params = list(encoder.parameters()) + list(decoder.parameters())
    opt = torch.optim.Adam(params, lr=0.01)
    started = time.perf_counter()
    for _ in range(steps):
        data = pairs(64, rng)
        src, lengths = pad([src_tok.encode(s).ids for s, _ in data])
        tgt, _ = pad([tgt_tok.encode(t).ids + [EOS] for _, t in data])
        memory, hidden_state = encoder(src, lengths)
        mask = torch.arange(src.shape[1])[None] < lengths[:, None]
        prev, loss = torch.full((len(data),), SOS), torch.zeros(())
        for t in range(tgt.shape[1]):  # teacher forcing
            logits, hidden_state, _ = decoder(prev, hidden_state, memory, mask)
            loss = loss + F.cross_entropy(logits, tgt[:, t], ignore_index=0)
            prev = tgt[:, t]
        opt.zero_grad()
        (loss / tgt.shape[1]).backward()
        nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    encoder.eval()
    decoder.eval()
    test = pairs(200, random.Random(seed + 1))
    right = sum(greedy(encoder, decoder, src_tok.encode(s).ids, tgt_tok) == t for s, t in test)
    print(f"trained in {time.perf_counter() - started:.1f} s: {right / len(test):.0%} of "
          f"{len(test)} new numbers read exactly (greedy)")
    torch.save({"encoder": encoder.state_dict(), "decoder": decoder.state_dict()},
               out / "weights.pt")
    return encoder, decoder


def greedy(encoder: EncoderRNN, decoder: AttnDecoderRNN, ids: list[int], tgt_tok: object,
           max_len: int = 20) -> str:
    with torch.no_grad():
        memory, hidden = encoder(torch.tensor([ids]), torch.tensor([len(ids)]))
        mask = torch.ones(1, len(ids), dtype=torch.bool)
        prev, out = torch.tensor([SOS]), []
        for _ in range(max_len):
            logits, hidden, _ = decoder(prev, hidden, memory, mask)
            prev = logits.argmax(-1)
            if int(prev) == EOS:
                break
            out.append(int(prev))
    return tgt_tok.decode(out)  # type: ignore[attr-defined, no-any-return]


def export(encoder: EncoderRNN, decoder: AttnDecoderRNN, out: Path) -> None:
    """What a user has before seqserve: the encoder and one decoder step as ONNX files with
    their own tensor names (exported here with dynamo=False; seqserve.pack's Python API
    also takes the module itself and exports it with the default dynamo exporter)."""
    ids, lengths = pad([[3, 4, 5, 6], [7, 8]])
    with torch.no_grad():
        memory, hidden = encoder(ids, lengths)
    mask = torch.arange(ids.shape[1])[None] < lengths[:, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(encoder, (ids, lengths), str(out / "encoder.onnx"),
                          input_names=["digits", "lengths"],
                          output_names=["encoder_outputs", "hidden"],
                          dynamic_axes={"digits": {0: "batch", 1: "src_len"},
                                        "lengths": {0: "batch"},
                                        "encoder_outputs": {0: "batch", 1: "src_len"},
                                        "hidden": {1: "batch"}}, dynamo=False)
        torch.onnx.export(decoder, (torch.tensor([SOS, SOS]), hidden, memory, mask),
                          str(out / "decoder.onnx"),
                          input_names=["prev", "hidden", "encoder_outputs", "mask"],
                          output_names=["logits", "new_hidden", "weights"],
                          dynamic_axes={"prev": {0: "rows"}, "hidden": {1: "rows"},
                                        "encoder_outputs": {0: "rows", 1: "src_len"},
                                        "mask": {0: "rows", 1: "src_len"},
                                        "logits": {0: "rows"}, "new_hidden": {1: "rows"},
                                        "weights": {0: "rows", 1: "src_len"}}, dynamo=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("work/digits"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repo", type=Path, default=None,
                    help="also pack the modules into this model repository (Python API)")
    ap.add_argument("--name", default="digits-py")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    encoder, decoder = train(args.out, args.steps)
    export(encoder, decoder, args.out)
    print(f"wrote {args.out}/source.json, target.json, encoder.onnx, decoder.onnx, weights.pt")
    if args.repo is not None:
        import seqserve.pack

        bundle = seqserve.pack.translator(encoder=encoder, step=decoder,
                                          source_tokenizer=args.out / "source.json",
                                          target_tokenizer=args.out / "target.json",
                                          repo=args.repo, name=args.name)
        print(f"packed {bundle}")


if __name__ == "__main__":
    main()
