"""The two workloads: every request a new text, composed from the langid dataset's phrases.

Text number g (0, 1, 2, ...) is a pure function of g, computed the same way here and by the
wrk script (compose.lua), which reads the word lists this module writes:

- short: phrase a = g mod N and a second phrase of the same language, the (1 + g div N)-th
  after it in that language's list: two number phrases, ~20 tokens. Distinct for
  g < N x (smallest language list - 1).
- long:  10-60 consecutive words of the shuffled phrases' word stream (M words) starting at
  word (g x 7919) mod M, length 10 + ((g x 40503) mod 65521) mod 51: ~100 tokens, cut at the
  bundle's 256 by every server. Distinct starts for g < M.

- translate: the g-th of the numbers-en-fr dataset's English sources (all splits, shuffled),
  as the demo sends them. Distinct for g < the number of sources.

Each load run takes its own range of g (measurement, warm-up and answer checks never share a
text), and each connection takes every C-th number of its range.
"""

from __future__ import annotations

import random
from pathlib import Path

LONG_STRIDE = 7919
LONG_MIX, LONG_MOD = 40503, 65521
LONG_MIN_WORDS, LONG_SPAN = 10, 51


class Workload:
    """One workload: its name, how texts are composed, and the data file compose.lua reads."""

    def __init__(self, name: str, phrases: tuple[str, ...] = (), langs: tuple[int, ...] = (),
                 words: tuple[str, ...] = (), texts: tuple[str, ...] = ()) -> None:
        self.name = name
        self.texts = texts
        """The whole texts, in order (translate)."""
        self.phrases = phrases
        self.langs = langs
        """Language index of each phrase (short)."""
        self.words = words
        self.by_lang: dict[int, list[int]] = {}
        """Phrase numbers of each language, in order."""
        self.position: list[int] = []
        """Where each phrase stands in its language's list."""
        for i, lang in enumerate(langs):
            group = self.by_lang.setdefault(lang, [])
            self.position.append(len(group))
            group.append(i)

    @property
    def capacity(self) -> int:
        """How many distinct texts the numbering gives before it repeats."""
        if self.name == "short":
            return len(self.phrases) * (min(len(v) for v in self.by_lang.values()) - 1)
        if self.texts:
            return len(self.texts)
        return len(self.words)

    def text(self, g: int) -> str:
        """Text number g."""
        if self.name == "short":
            n = len(self.phrases)
            a, r = g % n, g // n
            same = self.by_lang[self.langs[a]]
            b = same[(self.position[a] + 1 + r) % len(same)]
            return f"{self.phrases[a]} {self.phrases[b]}"
        if self.texts:
            return self.texts[g % len(self.texts)]
        m = len(self.words)
        start = (g * LONG_STRIDE) % m
        count = LONG_MIN_WORDS + ((g * LONG_MIX) % LONG_MOD) % LONG_SPAN
        return " ".join(self.words[(start + k) % m] for k in range(count))

    def data_file(self, path: Path) -> Path:
        """Write what compose.lua reads: the kind, then "lang<TAB>phrase", one word a line
        (long) or one text a line (kind "list")."""
        if self.texts:
            path.write_text("list\n" + "".join(f"{t}\n" for t in self.texts), encoding="utf-8")
            return path
        if self.name == "short":
            body = "".join(f"{lang}\t{p}\n"
                           for lang, p in zip(self.langs, self.phrases, strict=True))
        else:
            body = "".join(f"{w}\n" for w in self.words)
        path.write_text(f"{self.name}\n{body}", encoding="utf-8")
        return path


def workloads(rows: list[tuple[str, str]], seed: int = 0) -> dict[str, Workload]:
    """Both workloads from (text, label) phrases, shuffled with `seed`."""
    clean = [(" ".join(t.split()), lab) for t, lab in rows if t.strip()]
    random.Random(seed).shuffle(clean)
    labels = sorted({lab for _, lab in clean})
    phrases = tuple(t for t, _ in clean)
    langs = tuple(labels.index(lab) for _, lab in clean)
    words = tuple(w for t in phrases for w in t.split())
    if len(words) % LONG_STRIDE == 0:
        words = words[:-1]
    return {"short": Workload("short", phrases=phrases, langs=langs),
            "long": Workload("long", words=words)}


def langid_rows(seed: int = 0) -> list[tuple[str, str]]:
    """Every phrase of the built-in langid dataset (all splits) with its label."""
    from seqserve.models.data.registry import generate

    ds = generate("langid", seed=seed)
    return [(str(ex["text"]), str(ex["label"])) for split in ds.splits.values() for ex in split]


def translate_workload(seed: int = 0) -> Workload:
    """The translate workload: the numbers-en-fr dataset's sources (all splits), shuffled."""
    from seqserve.models.data.registry import generate

    ds = generate("numbers-en-fr", seed=seed)
    texts = sorted({" ".join(str(ex["source"]).split()) for split in ds.splits.values()
                    for ex in split} - {""})
    random.Random(seed).shuffle(texts)
    return Workload("translate", texts=tuple(texts))
