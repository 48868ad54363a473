"""Classifying surnames by language with a character-level GRU, served by seqserve.

The model of PyTorch's "NLP from scratch: classifying names with a character-level RNN"
tutorial, written the way that tutorial writes it: its own character vocabulary (here saved as
a Hugging Face `tokenizer.json`, built with the `tokenizers` library), a GRU read at each
name's last character, trained in a few seconds on the small list of surnames below.

    python examples/names_classifier.py --out work/names
        trains, then writes what a user of any framework has: work/names/tokenizer.json,
        labels.txt, names.onnx (torch.onnx.export with our own tensor names), names.pt
        (a TorchScript twin) and weights.pt (the state dict)
    python examples/names_classifier.py --out work/names --repo model_repository --name names-py
        also packs the trained module with seqserve's Python API (seqserve.pack.classifier)

The files are packed with the CLI as docs/own-model/index.md ("Serve your own model") shows:
    seqserve pack classifier --onnx work/names/names.onnx --tokenizer work/names/tokenizer.json ...
"""

from __future__ import annotations

import argparse
import random
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

NAMES = {
    "English": """Smith Johnson Williams Brown Jones Davis Wilson Anderson Taylor Moore Jackson
        White Harris Clark Lewis Robinson Walker Young Allen King Wright Scott Hill Green Adams
        Baker Nelson Carter Mitchell Turner Parker Collins Edwards Stewart Morris Cook Rogers
        Morgan Cooper Peterson Bailey Reed Kelly Howard Ward Richardson Watson Brooks Wood
        Bennett Gray Hughes Price Sanders Myers Long Ross Foster O'Neill Thompson Fletcher
        Whitaker Ashworth Blackwood Hawthorne Sutton Bradshaw""",
    "French": """Bernard Dubois Durand Lefebvre Leroy Moreau Laurent Lefevre Michel David
        Bertrand Roux Vincent Fournier Morel Girard Andre Mercier Dupont Lambert Bonnet
        Francois Legrand Garnier Faure Rousseau Blanc Guerin Roussel Nicolas Perrin Morin
        Mathieu Clement Gauthier Dumont Fontaine Chevalier Robin Masson Gerard Boyer Denis
        Lemaire Duval Joly Roche Noel Lucas Meunier Marchand Dufour Blanchard Barbier Brun
        Dumas Brunet Leroux Renard Arnaud Rolland Caron Aubert Giraud Leclerc Bourgeois Renaud
        Lemoine Picard Gaillard Lacroix Dupuis Hubert Riviere Guillaume Deschamps""",
    "German": """Müller Schmidt Schneider Fischer Weber Meyer Wagner Becker Schulz Hoffmann
        Schäfer Koch Bauer Richter Klein Wolf Schröder Neumann Schwarz Zimmermann Braun Krüger
        Hartmann Lange Schmitt Werner Schmitz Krause Meier Lehmann Schulze Maier Köhler
        Herrmann König Mayer Huber Kaiser Fuchs Scholz Möller Weiß Jung Hahn Schubert Vogel
        Friedrich Keller Günther Winkler Roth Beck Lorenz Baumann Franke Albrecht Schuster
        Ludwig Böhm Winter Kraus Schumacher Kramer Vogt Stein Jäger Sommer Groß Seidel Heinrich
        Brandt Haas Schreiber Graf Schulte Dietrich Ziegler Kuhn Pohl Engel Horn Busch
        Bergmann Voigt Sauer Pfeiffer""",
    "Italian": """Rossi Russo Ferrari Esposito Bianchi Romano Colombo Ricci Marino Greco Bruno
        Gallo Conti Mancini Costa Giordano Rizzo Lombardi Moretti Barbieri Fontana Santoro
        Mariani Rinaldi Caruso Ferrara Galli Martini Leone Longo Gentile Martinelli Vitale
        Lombardo Serra Coppola Marchetti Parisi Villa Conte Ferraro Ferri Fabbri Bianco Marini
        Grasso Valentini Messina Sala Gatti Pellegrini Palumbo Sanna Farina Rizzi Monti
        Cattaneo Morelli Amato Silvestri Mazza Testa Grassi Pellegrino Carbone Giuliani
        Benedetti Barone Rossetti Caputo Montanari Guerra Palmieri Bernardi Fiore Ferretti
        Bellini Basile Riva Donati Piras Vitali Battaglia Sartori Neri D'Angelo D'Amico""",
}
LABELS = list(NAMES)


def build_tokenizer(names: list[str], path: Path) -> None:
    """One id per character (lower-cased), "<pad>" 0 and "<unk>" 1: our own vocabulary, saved
    as a tokenizer.json so that training and serving encode a name the same way."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    chars = sorted({c for name in names for c in name.lower()})
    vocab = {"<pad>": 0, "<unk>": 1} | {c: i + 2 for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # every character a token
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<unk>"])
    tok.save(str(path))


class CharGRU(nn.Module):
    """Embedding -> GRU -> the state at each name's last character -> one score per language."""

    def __init__(self, vocab_size: int, n_labels: int, hidden: int = 64) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, 32, padding_idx=0)
        self.gru = nn.GRU(32, hidden, batch_first=True)
        self.out = nn.Linear(hidden, n_labels)

    def forward(self, chars: Tensor, lengths: Tensor) -> Tensor:
        output, _ = self.gru(self.embedding(chars))  # (batch, seq, hidden)
        last = output[torch.arange(output.shape[0]), lengths - 1]  # padding comes after it
        return self.out(last)  # (batch, labels) scores


def batch(rows: list[list[int]]) -> tuple[Tensor, Tensor]:
    """Right-padded ids and lengths."""
    lengths = torch.tensor([len(r) for r in rows])
    ids = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
    return ids, lengths


def train(out: Path, epochs: int = 30, seed: int = 0) -> tuple[CharGRU, list[str]]:
    from tokenizers import Tokenizer

    random.seed(seed)
    torch.manual_seed(seed)
    data = [(name, i) for i, lang in enumerate(LABELS) for name in NAMES[lang].split()]
    build_tokenizer([n for n, _ in data], out / "tokenizer.json")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    (out / "labels.txt").write_text("\n".join(LABELS) + "\n", encoding="utf-8")
    random.shuffle(data)
    held_out, data = data[:40], data[40:]
    encode = [(tok.encode(n).ids, y) for n, y in data]
    model = CharGRU(tok.get_vocab_size(), len(LABELS))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    started = time.perf_counter()
    for _ in range(epochs):
        random.shuffle(encode)
        for k in range(0, len(encode), 32):
            ids, lengths = batch([r for r, _ in encode[k:k + 32]])
            loss = nn.functional.cross_entropy(model(ids, lengths),
                                               torch.tensor([y for _, y in encode[k:k + 32]]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        def accuracy(rows: list[tuple[str, int]]) -> float:
            ids, lengths = batch([tok.encode(n).ids for n, _ in rows])
            return float((model(ids, lengths).argmax(-1) == torch.tensor([y for _, y in rows]))
                         .float().mean())

        print(f"trained in {time.perf_counter() - started:.1f} s: accuracy "
              f"{accuracy(data):.0%} on the training names, {accuracy(held_out):.0%} on "
              f"{len(held_out)} held-out names")
    torch.save(model.state_dict(), out / "weights.pt")
    return model, LABELS


def export(model: CharGRU, out: Path) -> None:
    """What a user has before seqserve: an ONNX file with their own tensor names (and a
    TorchScript twin), here with dynamo=False; the default dynamo exporter's files are read
    too (pack reads the names.onnx.data file it writes)."""
    ids, lengths = batch([[2, 3, 4, 5, 6], [7, 8]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids, lengths), str(out / "names.onnx"),
                          input_names=["chars", "lengths"], output_names=["scores"],
                          dynamic_axes={"chars": {0: "batch", 1: "seq"},
                                        "lengths": {0: "batch"}, "scores": {0: "batch"}},
                          dynamo=False)
        torch.jit.save(torch.jit.trace(model, (ids, lengths)), str(out / "names.pt"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("work/names"))
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--repo", type=Path, default=None,
                    help="also pack the module into this model repository (Python API)")
    ap.add_argument("--name", default="names-py")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    model, labels = train(args.out, args.epochs)
    export(model, args.out)
    print(f"wrote {args.out}/tokenizer.json, labels.txt, names.onnx, names.pt, weights.pt")
    if args.repo is not None:
        import seqserve.pack

        bundle = seqserve.pack.classifier(model, tokenizer=args.out / "tokenizer.json",
                                          labels=labels, repo=args.repo, name=args.name)
        print(f"packed {bundle}")


if __name__ == "__main__":
    main()
