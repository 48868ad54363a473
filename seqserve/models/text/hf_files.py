"""A bundle's tokenizer as Hugging Face tools load one: `tokenizer.json` (the `tokenizers`
format) and `tokenizer_config.json` (what `transformers.AutoTokenizer` reads beside it: the
special tokens, `model_max_length`, `chat_template`). Torch-free: the server serves both
(`GET /v1/models/{name}/tokenizer.json`), so HF-based clients (guidellm, lm-eval's HF
tokenizer, transformers) count and render tokens offline, as the server does.

- A tokenizer.json bundle: its own file (its `to_str()`).
- A SentencePiece model, converted from its proto (as transformers' `SpmConverter` does):
  the normalizer is its precompiled character map (the NFKC / case-folding rule compiled into
  the model; tokenizers reads it per grapheme cluster, so "\r\n" is split first, but a
  cluster whose first character alone has a mapping is read as that character's mapping
  alone, where SentencePiece reads the rest too: rare, as fully composed text has none)
  and, where the model removes extra whitespace, runs of spaces as one and no space at
  either end; the pre-tokenizer and decoder are `Metaspace` ("▁", prepended to each
  text unless the model has no dummy prefix: the character models); the model a `Unigram`
  (every piece with its score, the unknown piece's id; unknown characters in a row are one
  unknown token, as in SentencePiece), a `BPE` (its merges read from the
  vocabulary, ranked by the merged piece's score, as SentencePiece merges), or a `WordLevel`
  (SentencePiece's word models: a word is its piece or unknown; SentencePiece reads unknown
  words in a row as one unknown token, WordLevel as one each, which tokenizers cannot
  express; a character model is a Unigram over its characters). The special tokens (pad,
  unk, bos, eos) are added tokens, read as themselves in a text (the convention the
  language-model routes follow; the other tasks read such strings as text).
- `bos_first` (language models: the server puts bos before every prompt) adds a
  `TemplateProcessing` post-processor writing bos first, so `encode(text)` with
  `add_special_tokens` (its default) gives what `/tokenize` gives.
"""

from __future__ import annotations

import json
from typing import Any

from seqserve.models.text.tokenizer import Tokenizer
from seqserve.models.text.tokenizer_files import JsonTokenizer, TextTokenizer

SPACE = "\u2581"
_UNIGRAM, _BPE, _WORD, _CHAR = 1, 2, 3, 4  # SentencePiece's TrainerSpec.ModelType
_NORMAL, _UNKNOWN, _CONTROL, _USER, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6  # ModelProto.Piece.Type


def tokenizer_json(tok: TextTokenizer, bos_first: bool) -> str:
    """The tokenizer.json text of `tok` (module doc)."""
    if isinstance(tok, JsonTokenizer):
        return str(tok._tok.to_str())  # noqa: SLF001  # the bundle's own file
    if not isinstance(tok, Tokenizer):
        raise TypeError(f"no Hugging Face form for a {type(tok).__name__}")
    return str(_from_sentencepiece(tok, bos_first).to_str())


def _specials(tok: TextTokenizer) -> list[tuple[int, str]]:
    out: dict[int, str] = {}
    for i in (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id):
        if 0 <= i < tok.vocab_size:
            out[i] = tok.id_to_piece(i)
    return sorted(out.items())


def _from_sentencepiece(tok: Tokenizer, bos_first: bool) -> Any:
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(tok.model_proto)
    pieces = [(p.piece, float(p.score)) for p in proto.pieces]
    kind = proto.trainer_spec.model_type
    unk = tok.unk_id if 0 <= tok.unk_id < len(pieces) else None
    unk_piece = None if unk is None else pieces[unk][0]
    model: Any
    if kind == _WORD:
        model = models.WordLevel({p: i for i, (p, _) in enumerate(pieces)},
                                 unk_token=unk_piece)
    elif kind == _BPE:
        model = models.BPE({p: i for i, (p, _) in enumerate(pieces)},
                           _merges(proto, pieces), unk_token=unk_piece, fuse_unk=True,
                           byte_fallback=bool(proto.trainer_spec.byte_fallback))
    else:  # unigram, and char (a unigram over single characters gives the same split)
        model = models.Unigram(pieces, unk, bool(proto.trainer_spec.byte_fallback))
    hf = HFTokenizer(model)
    spec = proto.normalizer_spec
    steps: list[Any] = []
    if spec.precompiled_charsmap:
        charsmap = normalizers.Precompiled(spec.precompiled_charsmap)
        if not spec.remove_extra_whitespaces:  # "\r\n" is one grapheme to tokenizers
            steps.append(normalizers.Replace("\r\n", "".join(
                charsmap.normalize_str(c) for c in "\r\n")))
        steps.append(charsmap)
    if spec.remove_extra_whitespaces:  # SentencePiece's: spaces only, not other blanks
        steps += [normalizers.Replace(Regex(" {2,}"), " "),
                  normalizers.Replace(Regex("^ | $"), "")]
    if steps:
        hf.normalizer = normalizers.Sequence(steps)
    scheme = "always" if spec.add_dummy_prefix else "never"
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=scheme,
                                                split=kind != _CHAR)
    hf.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme=scheme,
                                    split=kind != _CHAR)
    specials = _specials(tok)
    hf.add_special_tokens([AddedToken(s, normalized=False, special=True)
                           for _, s in specials])
    if bos_first and 0 <= tok.bos_id < len(pieces):
        from tokenizers import processors

        bos = tok.id_to_piece(tok.bos_id)
        hf.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.bos_id)])
    return hf


def _merges(proto: Any, pieces: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """A SentencePiece BPE model's merges: every split of a normal piece into two pieces,
    ranked by the merged piece's score (SentencePiece merges the best-scoring pair first),
    then by its parts' (as transformers' SentencePieceExtractor ranks them)."""
    rank = {p: i for i, (p, _) in enumerate(pieces)
            if proto.pieces[i].type in (_NORMAL, _USER)}
    found = []
    for piece, at in rank.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in rank and right in rank:
                found.append(((at, rank[left], rank[right]), (left, right)))
    return [pair for _, pair in sorted(found)]


def tokenizer_config(tok: TextTokenizer, max_tokens: int, bos_first: bool,
                     chat_template: str | None) -> dict[str, Any]:
    """tokenizer_config.json: transformers' `PreTrainedTokenizerFast` over tokenizer.json,
    its special tokens by their strings, `model_max_length` (the token limit of one text),
    `add_bos_token` as the server adds it, and the bundle's chat template, if any."""
    def string(i: int) -> str | None:
        return tok.id_to_piece(i) if 0 <= i < tok.vocab_size else None

    added = {str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": True} for i, s in _specials(tok)}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added,
        "bos_token": string(tok.bos_id), "eos_token": string(tok.eos_id),
        "unk_token": string(tok.unk_id), "pad_token": string(tok.pad_id),
        "model_max_length": int(max_tokens), "add_bos_token": bos_first,
        "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "legacy": False}
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def dumps(value: Any) -> bytes:
    """JSON as the files are served (UTF-8, not ASCII-escaped)."""
    return json.dumps(value, ensure_ascii=False, indent=2).encode()
