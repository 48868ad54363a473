"""Independent check (not a test): English number phrases as people type them, through the
trained translator and tagger, scored per way of writing.

Nothing here comes from the training data code (models/data/): values are drawn with their
own seed and kept only where they lie outside the training split of the built-in data
(seed 0), sources are `num2words(n, lang="en")` changed by hand (commas dropped, "and" dropped,
capitals, full stop...), references are `num2words(n, lang="fr")` lowercased without commas,
and expected tags come from a small lexicon below. Numbers below 100 are building blocks that
training always sees: they are checked all, one by one.

    .venv/bin/python bench/surface_check.py --translator runs/numbers-en-fr \
        --tagger runs/numbers-tags
    .venv/bin/python bench/surface_check.py --url http://127.0.0.1:8000   # the served models

Translations use beam 5 with no length penalty (the server's default search) in both modes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sacrebleu
from num2words import num2words

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqserve.models.data.sampling import split_for  # noqa: E402  (only: which values trained)

Writer = Callable[[str], str]
WAYS: dict[str, Writer] = {
    "lower case, no commas": lambda s: s.replace(",", ""),
    "num2words as it comes (commas, \"and\")": lambda s: s,
    "American, no \"and\", no commas": lambda s: re.sub(r" and\b", "", s).replace(",", ""),
    "num2words + final full stop": lambda s: s + ".",
    "Capitalised + full stop": lambda s: s[:1].upper() + s[1:] + ".",
    "ALL CAPS": lambda s: s.upper(),
    "spaced compounds (\"twenty one\")": lambda s: s.replace("-", " "),
    "quoted, extra spaces": lambda s: '  "' + "  ".join(s.split()) + '" ',
}
SMALL_WAYS = ("num2words as it comes (commas, \"and\")", "Capitalised + full stop", "ALL CAPS")
_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
          "eighteen", "nineteen")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
LEXICON = {**dict.fromkeys(_UNITS, "unit"), **dict.fromkeys(_TEENS, "teen"),
           **dict.fromkeys(_TENS, "ten"), "hundred": "hundred", "thousand": "scale",
           "and": "conj", "a": "article"}


EN_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
             "September", "October", "November", "December")
FR_MONTHS = ("janvier", "février", "mars", "avril", "mai", "juin", "juillet", "août",
             "septembre", "octobre", "novembre", "décembre")


def french(n: int, to: str = "cardinal") -> str:
    return " ".join(num2words(n, lang="fr", to=to).replace(",", " ").lower().split())


def expected_tags(text: str) -> list[str]:
    """Cardinal word roles by lexicon (a spaced "twenty one" is ten, unit)."""
    return [LEXICON[re.sub(r"[^a-z-]", "", w.lower()).split("-")[0]] for w in text.split()]


def held_out(rng: random.Random, n: int, lo: int, hi: int, log: bool = True,
             key: Callable[[int], int | str] = lambda v: v) -> list[int]:
    """`n` distinct values in [lo, hi] whose split key the built-in training split (seed 0)
    never holds."""
    out: set[int] = set()
    while len(out) < n:
        if log:
            digits = rng.randint(len(str(lo)), len(str(hi)))
            v = rng.randint(max(lo, 10 ** (digits - 1)), min(hi, 10**digits - 1))
        else:
            v = rng.randint(lo, hi)
        if split_for(key(v), 0) != "train":
            out.add(v)
    return sorted(out)


def cases(seed: int, count: int) -> dict[str, list[tuple[str, str]]]:
    """Row name -> [(source, reference)]."""
    rng = random.Random(seed)
    numbers = held_out(rng, count, 100, 999_999)
    rows = {f"cardinal: {name}": [(way(num2words(n, lang="en")), french(n)) for n in numbers]
            for name, way in WAYS.items()}
    rows["0..99 on their own (each in 3 ways)"] = [
        (WAYS[w](num2words(n, lang="en")), french(n)) for n in range(100) for w in SMALL_WAYS]
    rows["\"a hundred\" / \"a thousand\" ..."] = [
        (num2words(n, lang="en").replace("one ", "a ", 1), french(n))
        for n in held_out(rng, count, 100, 199_999, log=False)
        if num2words(n, lang="en").startswith(("one hundred", "one thousand"))]
    rows["ordinal: Capitalised + full stop"] = [
        (WAYS["Capitalised + full stop"](num2words(n, lang="en", to="ordinal")),
         french(n, "ordinal")) for n in held_out(rng, count // 3, 100, 999_999)]
    rows["year: num2words + final full stop"] = [
        (num2words(y, lang="en", to="year") + ".", french(y))
        for y in held_out(rng, count // 3, 1000, 2099, log=False)]
    rows["amount: Capitalised, commas, full stop"] = [
        amount(u, c, rng.choice(("EUR", "USD"))) for u, c in zip(
            held_out(rng, count // 3, 100, 99_999),
            [rng.randint(1, 99) for _ in range(count // 3)], strict=True)]
    rows["date: Capitalised, comma after the month"] = [
        date(dt.date.fromordinal(d)) for d in held_out(
            rng, count // 3, dt.date(1900, 1, 1).toordinal(), dt.date(2099, 12, 31).toordinal(),
            log=False, key=lambda d: dt.date.fromordinal(d).isoformat())]
    return rows


def amount(units: int, cents: int, code: str) -> tuple[str, str]:
    """("Twelve thousand, three hundred and four dollars and five cents.", French)."""
    en_unit, fr_unit = ("euro", "euro") if code == "EUR" else ("dollar", "dollar")
    fr_cent = "centime" if code == "EUR" else "cent"
    source = (f"{num2words(units, lang='en')} {en_unit}{'s' * (units > 1)} and "
              f"{num2words(cents, lang='en')} cent{'s' * (cents > 1)}.")
    target = (f"{french(units)} {fr_unit}{'s' * (units > 1)} et "
              f"{french(cents)} {fr_cent}{'s' * (cents > 1)}")
    return source[:1].upper() + source[1:], target


def date(day: dt.date) -> tuple[str, str]:
    """("The twenty-first of March, two thousand and five", French)."""
    source = (f"The {num2words(day.day, lang='en', to='ordinal')} of {EN_MONTHS[day.month - 1]},"
              f" {num2words(day.year, lang='en', to='year')}")
    fr_day = "premier" if day.day == 1 else french(day.day)
    return source, f"le {fr_day} {FR_MONTHS[day.month - 1]} {french(day.year)}"


class Eager:
    """The trained models from their run directories (beam 5 like the server)."""

    def __init__(self, translator: Path | None, tagger: Path | None) -> None:
        from seqserve.models.checkpoint import load_run

        self.translator = load_run(translator) if translator else None
        self.tagger = load_run(tagger) if tagger else None

    def translate(self, texts: list[str]) -> list[str]:
        import torch

        from seqserve.models.nn.decoding import beam_search

        assert self.translator is not None
        model, _, tok = self.translator
        out = []
        for i in range(0, len(texts), 64):
            ids = [tok.encode(t) or [tok.unk_id] for t in texts[i : i + 64]]
            width = max(len(r) for r in ids)
            src = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in ids])  # (B, S)
            beams = beam_search(model, src, torch.tensor([len(r) for r in ids]), beam_size=5,
                                length_penalty=0.0)
            out += [tok.decode(b[0].tokens) for b in beams]
        return out

    def tag(self, texts: list[str]) -> list[list[str | None]]:
        import torch

        from seqserve.models.text.word_align import align

        assert self.tagger is not None
        model, config, tok = self.tagger
        out: list[list[str | None]] = []
        for text in texts:
            pieces = tok.encode_with_offsets(text)
            ids = torch.tensor([[p.id for p in pieces]])  # (1, T)
            best = model.tag(ids, torch.tensor([len(pieces)]))[0].argmax(-1).tolist()  # (T,)
            out.append([config["labels"][best[w.piece]] if w.piece >= 0 else None
                        for w in align(text, pieces)])
        return out


class Http:
    """The served models (POST /v1/models/{name}/translate and /tag)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(self.url + path, json.dumps(body).encode(),
                                         {"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def translate(self, texts: list[str]) -> list[str]:
        out = []
        for i in range(0, len(texts), 32):
            answer = self._post("/v1/models/numbers-en-fr/translate",
                                {"texts": texts[i : i + 32], "beam_size": 5})
            out += [r["translation"] for r in answer["results"]]
        return out

    def tag(self, texts: list[str]) -> list[list[str | None]]:
        out = []
        for i in range(0, len(texts), 32):
            answer = self._post("/v1/models/numbers-tags/tag", {"texts": texts[i : i + 32]})
            out += [[t["label"] for t in r["tokens"]] for r in answer["results"]]
        return out


def score(backend: Eager | Http, rows: list[tuple[str, str]], tagged: bool) -> dict[str, Any]:
    sources, refs = [s for s, _ in rows], [r for _, r in rows]
    hyps = backend.translate(sources)
    result: dict[str, Any] = {
        "rows": len(rows),
        "exact_match": sum(h.strip() == r for h, r in zip(hyps, refs, strict=True)) / len(rows),
        "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
        "wrong": [(s, r, h) for s, r, h in zip(sources, refs, hyps, strict=True) if h != r][:3]}
    if tagged:
        gold = [expected_tags(s) for s in sources]
        got = backend.tag(sources)
        pairs = [(g, p) for gs, ps in zip(gold, got, strict=True)
                 for g, p in zip(gs, ps, strict=True)]
        result["tag_accuracy"] = sum(g == p for g, p in pairs) / len(pairs)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--translator", type=Path, help="translator run directory (eager)")
    p.add_argument("--tagger", type=Path, help="tagger run directory (eager)")
    p.add_argument("--url", help="a running server instead of run directories")
    p.add_argument("--seed", type=int, default=20260)
    p.add_argument("--count", type=int, default=300, help="values per cardinal row")
    p.add_argument("--show-wrong", action="store_true")
    args = p.parse_args()
    backend = Http(args.url) if args.url else Eager(args.translator, args.tagger)
    tagged = bool(args.url or args.tagger)
    print("| how the source is written | rows | exact match | chrF |"
          + (" tagger token accuracy |" if tagged else ""))
    print("|---|---|---|---|" + ("---|" if tagged else ""))
    for name, rows in cases(args.seed, args.count).items():
        is_cardinal = name.startswith(("cardinal", "0..99", "\"a"))
        r = score(backend, rows, tagged and is_cardinal)
        tag = f" {100 * r['tag_accuracy']:.2f}% |" if "tag_accuracy" in r else (
            " - |" if tagged else "")
        print(f"| {name} | {r['rows']} | {100 * r['exact_match']:.2f}% | {r['chrf']:.2f} |{tag}")
        if args.show_wrong:
            for wrong in r["wrong"]:
                print(f"|   wrong: {wrong} | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
