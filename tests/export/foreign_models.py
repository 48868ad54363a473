"""Models written outside seqserve, in the style of the PyTorch tutorials, with their own
vocabularies (tokenizer.json files), for the `seqserve pack` tests. Initialised, not trained:
the comparisons only need the served answers to equal the eager module's."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LETTERS = list("abcdefghijklmnopqrstuvwxyz '")


def char_tokenizer(path: Path, specials: tuple[str, ...] = ("<pad>", "<unk>"),
                   letters: list[str] = LETTERS, post: bool = False) -> Path:
    """A character-level tokenizer.json: one id per character, spaces kept."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(specials)} | {c: len(specials) + i
                                                     for i, c in enumerate(letters)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(specials))
    if post:  # the source side saw "... </s>" in training
        tok.post_processor = processors.TemplateProcessing(
            single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    tok.save(str(path))
    return path


def word_tokenizer(path: Path, words: list[str]) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {w: i for i, w in enumerate(specials + words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(specials)
    tok.save(str(path))
    return path


class CharGRUClassifier(nn.Module):
    """The tutorial's name classifier: embedding, GRU, last valid state -> logits."""

    def __init__(self, vocab: int, labels: int, hidden: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 16, padding_idx=0)
        self.rnn = nn.GRU(16, hidden, batch_first=True)
        self.out = nn.Linear(hidden, labels)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        h, _ = self.rnn(self.emb(ids))  # (B, T, H)
        last = h.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, h.shape[2])).squeeze(1)
        return self.out(last)  # (B, C)


class LSTMTagger(nn.Module):
    """The tutorial's LSTM tagger: one tag per token (unidirectional: padding comes after)."""

    def __init__(self, vocab: int, tags: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)
        self.out = nn.Linear(24, tags)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        h, _ = self.lstm(self.emb(ids))
        return self.out(h)  # (B, T, C) logits


class NaiveBiGRUClassifier(nn.Module):
    """A bidirectional GRU run over the padding (the classic bug), or, with `fixed`, through
    seqserve.pack.bidirectional (same weights)."""

    def __init__(self, vocab: int, labels: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 16, padding_idx=0)
        self.rnn: nn.Module = nn.GRU(16, 16, batch_first=True, bidirectional=True)
        self.out = nn.Linear(32, labels)
        self.fixed = False

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        x = self.emb(ids)
        h, _ = self.rnn(x, lengths) if self.fixed else self.rnn(x)
        mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).unsqueeze(-1).float()
        return self.out((h * mask).sum(1) / lengths[:, None].float())


class Seq2Seq(nn.Module):
    """The tutorial's GRU encoder + Bahdanau-attention GRU decoder, own vocabularies."""

    def __init__(self, src_vocab: int, tgt_vocab: int, hidden: int = 32) -> None:
        super().__init__()
        self.src_emb = nn.Embedding(src_vocab, 16, padding_idx=0)
        self.encoder = nn.GRU(16, hidden, batch_first=True)
        self.tgt_emb = nn.Embedding(tgt_vocab, 16)
        self.wa = nn.Linear(hidden, hidden)
        self.ua = nn.Linear(hidden, hidden)
        self.va = nn.Linear(hidden, 1)
        self.decoder = nn.GRU(16 + hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, tgt_vocab)

    def encode(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        memory, _ = self.encoder(self.src_emb(ids))  # (B, S, H)
        last = memory.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, memory.shape[2]))
        return memory, last.transpose(0, 1).contiguous()  # (B, S, H), (1, B, H)

    def step(self, prev: Tensor, hidden: Tensor, memory: Tensor, mask: Tensor
             ) -> tuple[Tensor, Tensor, Tensor]:
        query = hidden[-1].unsqueeze(1)  # (R, 1, H)
        scores = self.va(torch.tanh(self.wa(query) + self.ua(memory))).squeeze(-1)  # (R, S)
        weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        context = torch.bmm(weights.unsqueeze(1), memory)  # (R, 1, H)
        x = torch.cat([self.tgt_emb(prev).unsqueeze(1), context], dim=-1)
        out, hidden = self.decoder(x, hidden)
        return self.out(out.squeeze(1)), hidden, weights  # (R, V), (1, R, H), (R, S)


def greedy(model: Seq2Seq, ids: list[int], bos: int, eos: int, max_len: int) -> list[int]:
    """The eager reference at beam 1."""
    src = torch.tensor([ids])
    with torch.no_grad():
        memory, hidden = model.encode(src, torch.tensor([len(ids)]))
        mask = torch.ones(1, len(ids), dtype=torch.bool)
        prev, out = torch.tensor([bos]), []
        for _ in range(max_len):
            logits, hidden, _ = model.step(prev, hidden, memory, mask)
            nxt = int(logits.argmax(-1))
            if nxt == eos:
                break
            out.append(nxt)
            prev = torch.tensor([nxt])
    return out


class RNNModel(nn.Module):
    """The PyTorch word_language_model's RNNModel: input (seq, batch), an LSTM or GRU over
    time, log-softmax over the vocabulary flattened to (seq*batch, ntoken), init_hidden."""

    def __init__(self, rnn_type: str, ntoken: int, ninp: int, nhid: int, nlayers: int) -> None:
        super().__init__()
        self.ntoken = ntoken
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers)
        self.decoder = nn.Linear(nhid, ntoken)
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def forward(self, input: Tensor, hidden: Tensor | tuple[Tensor, Tensor]
                ) -> tuple[Tensor, Tensor | tuple[Tensor, Tensor]]:
        output, hidden = self.rnn(self.encoder(input), hidden)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> Tensor | tuple[Tensor, Tensor]:
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


class CharGRULM(nn.Module):
    """A batch-first GRU language model with raw logits and its own one-token step."""

    def __init__(self, vocab: int, hidden: int = 32) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.rnn = nn.GRU(16, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        out, h = self.rnn(self.emb(tokens), h)  # (B, T, H), (1, B, H)
        return self.out(out), h  # logits (B, T, V)

    def step(self, token: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        logits, h = self(token[:, None], h)
        return logits[:, 0], h  # (R, V), (1, R, H)


def lm_log_probs(model: nn.Module, ids: list[int], hidden: object, time_major: bool
                 ) -> tuple[Tensor, object]:
    """The eager model over one text: log-probs (T, V) of the next token at each position."""
    x = torch.tensor([ids]).t() if time_major else torch.tensor([ids])
    with torch.no_grad():
        out, hidden = model(x, hidden)
    return torch.log_softmax(out.reshape(len(ids), -1), -1), hidden


def lm_greedy(model: nn.Module, ids: list[int], hidden: object, eos: int, max_new: int,
              time_major: bool) -> tuple[list[int], list[float], str]:
    """The eager reference of greedy generation: ids (bos first) read, then argmax tokens
    until eos (not returned) or max_new: (tokens, their log-probs, finish reason)."""
    lp, hidden = lm_log_probs(model, ids, hidden, time_major)
    out: list[int] = []
    lps: list[float] = []
    for _ in range(max_new):
        nxt = int(lp[-1].argmax())
        if nxt == eos:
            return out, lps, "eos"
        out.append(nxt)
        lps.append(float(lp[-1, nxt]))
        lp, hidden = lm_log_probs(model, [nxt], hidden, time_major)
    return out, lps, "length"
