"""What every peer server shares: read the bundle, tokenize, pad, answer (numpy + sentencepiece).

The peers run in their own environments (mosec and TorchServe live in a separate venv), so
this file imports nothing from seqserve: it reads the bundle's manifest.json and
tokenizer.model directly. Each peer answers `{"results": [{"label": ..., "score": ...}]}`,
one result per text, the fields of seqserve's classify answer that the harness checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm


class Bundle:
    """A classifier bundle folder: tokenizer, labels, token limit, graph files."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        manifest = json.loads((self.folder / "manifest.json").read_text())
        self.labels: list[str] = list(manifest["labels"])
        self.max_tokens = int(manifest.get("limits", {}).get("max_tokens", 256))
        self.pad_id = int(manifest["tokenizer"]["pad_id"])
        self.unk_id = int(manifest["tokenizer"]["unk_id"])
        self.sp = spm.SentencePieceProcessor(model_file=str(self.folder / "tokenizer.model"))
        self.onnx = self.folder / "classifier.onnx"
        self.torchscript = self.folder / "classifier.pt"

    def encode(self, text: str) -> list[int]:
        """Token ids cut at the bundle's limit (an empty text becomes one unk token)."""
        return list(self.sp.encode(text))[: self.max_tokens] or [self.unk_id]

    def pad(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids (B, T) and lengths (B,), both int64."""
        lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
        ids = np.full((len(rows), int(lengths.max())), self.pad_id, dtype=np.int64)  # (B, T)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        return ids, lengths

    def results(self, logits: np.ndarray) -> list[dict[str, Any]]:
        """One {"label", "score"} per row of logits (B, C)."""
        z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)  # (B, C)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)  # (B, C)
        best = probs.argmax(axis=1)  # (B,)
        return [{"label": self.labels[int(j)], "score": float(probs[i, j])}
                for i, j in enumerate(best)]


def body_of(body: Any) -> dict[str, Any]:
    """A request body (dict, or its JSON bytes)."""
    return json.loads(body) if isinstance(body, (bytes, bytearray, str)) else dict(body)


def texts_of(body: Any) -> list[str]:
    """The texts of a request body {"texts": [...]} (dict, or its JSON bytes)."""
    return [str(t) for t in body_of(body)["texts"]]


def per_request(results: list[Any], counts: list[int]) -> list[dict[str, Any]]:
    """A batch's results, in order, split back into one {"results": [...]} per request."""
    answers, at = [], 0
    for n in counts:
        answers.append({"results": results[at: at + n]})
        at += n
    return answers


def torchserve_entry(service: Any) -> Any:
    """TorchServe's module-level `handle(data, context)` for a handler object with `ready`,
    `initialize(context)` and `handle(data, context)`: the first call (data None)
    initializes."""
    def handle(data: list[dict[str, Any]] | None, context: Any) -> list[dict[str, Any]] | None:
        if not service.ready:
            service.initialize(context)
        if data is None:
            return None
        return service.handle(data, context)

    return handle


class TranslatorBundle:
    """A translator bundle folder (encoder + decoder_step ONNX graphs), and a beam search over
    it written the plain way: one request at a time, the decoder batched over that request's
    live hypotheses. Scoring as seqserve's defaults: beam 5, n-best 1, no length or coverage
    penalty, at most ceil(2 x source tokens) + 10 generated tokens (EOS included) and the
    bundle's max_decode_length, a step keeps the 2B best candidates, an EOS among the first B
    finishes, the first B others go on; stop when the best live log-prob can no longer beat
    the best finished one."""

    def __init__(self, folder: str | Path, threads: int = 1) -> None:
        import onnxruntime as ort

        self.folder = Path(folder)
        manifest = json.loads((self.folder / "manifest.json").read_text())
        src = manifest["tokenizer"]
        tgt = manifest.get("target_tokenizer") or src
        self.sp = spm.SentencePieceProcessor(model_file=str(self.folder / src["file"]))
        self.tgt_sp = (self.sp if tgt is src else
                       spm.SentencePieceProcessor(model_file=str(self.folder / tgt["file"])))
        self.unk_id = int(src["unk_id"])
        self.bos_id, self.eos_id = int(tgt["bos_id"]), int(tgt["eos_id"])
        self.skip = {int(tgt["pad_id"]), self.bos_id, self.eos_id}
        self.vocab_size = int(tgt["vocab_size"]) or self.tgt_sp.get_piece_size()
        limits = manifest.get("limits", {})
        self.max_tokens = int(limits.get("max_tokens", 256))
        self.max_decode = int(limits.get("max_decode_length", 128))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        graphs = manifest["graphs"]

        def session(name: str) -> Any:
            return ort.InferenceSession(str(self.folder / graphs[name]["onnx"]), opts,
                                        providers=["CPUExecutionProvider"])

        self.encoder, self.step = session("encoder"), session("decoder_step")
        # schema 3: the encoder may return the memory's projected attention keys, which the
        # step then takes (the same graphs seqserve serves: a fair comparison)
        self.keys = any(t["name"] == "keys" for t in graphs["encoder"]["outputs"])

    def _encode_batch(self, src: np.ndarray, lengths: np.ndarray) -> tuple[Any, ...]:
        """memory, mask, state and {"keys": ...} (empty without keys) of a padded batch."""
        out = self.encoder.run(None, {"src_ids": src, "src_lengths": lengths})
        return out[0], out[1], out[2], ({"keys": out[3]} if self.keys else {})

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text))[: self.max_tokens] or [self.unk_id]

    def translate(self, text: str, beam: int = 5) -> dict[str, Any]:
        """{"translation", "token_ids", "score"} of the best hypothesis."""
        ids = self.encode(text)
        src = np.array([ids], dtype=np.int64)  # (1, S)
        memory, mask, state, keys = self._encode_batch(
            src, np.array([len(ids)], dtype=np.int64))
        cap = max(1, min(self.max_decode, 2 * len(ids) + 10))
        k = np.array([min(2 * beam + 1, self.vocab_size)], dtype=np.int64)
        tokens: list[list[int]] = [[]]
        logp = np.zeros(1)  # (R,)
        prev = np.array([self.bos_id], dtype=np.int64)  # (R,)
        best: tuple[float, list[int]] | None = None
        while tokens:
            state, top_lp, top_ids, _ = self.step.run(None, {
                "prev_ids": prev, "state": state, "memory": memory, "src_mask": mask,
                "memory_index": np.zeros(len(tokens), dtype=np.int64), "k": k, **keys})
            cand = (logp[:, None] + top_lp).ravel()  # (R * k,)
            order = np.argsort(-cand, kind="stable")[: 2 * beam]
            keep_rows, keep_tok, keep_lp = [], [], []
            for rank, c in enumerate(order):
                row, tok, lp = int(c) // top_lp.shape[1], int(top_ids.ravel()[c]), float(cand[c])
                if tok == self.eos_id:
                    if rank < beam and (best is None or lp > best[0]):
                        best = (lp, [*tokens[row], tok])
                    continue
                if len(keep_rows) < beam:
                    keep_rows.append(row)
                    keep_tok.append(tok)
                    keep_lp.append(lp)
            length = len(tokens[0]) + 1
            tokens = [[*tokens[r], t] for r, t in zip(keep_rows, keep_tok, strict=True)]
            logp = np.array(keep_lp)
            if length >= cap:  # the cap reached: the live ones finish as they are
                for lp, toks in zip(keep_lp, tokens, strict=True):
                    if best is None or lp > best[0]:
                        best = (lp, toks)
                break
            if best is not None and (not keep_lp or min(max(keep_lp), 0.0) <= best[0]):
                break
            rows = np.array(keep_rows, dtype=np.int64)
            state, prev = state[rows], np.array(keep_tok, dtype=np.int64)
        assert best is not None
        return self._answer(best)

    def _answer(self, best: tuple[float, list[int]]) -> dict[str, Any]:
        out = [t for t in best[1] if t not in self.skip]
        return {"translation": str(self.tgt_sp.decode(out)), "token_ids": out,
                "score": best[0]}

    def translate_batch(self, texts: list[str], beam: int = 5) -> list[dict[str, Any]]:
        """`translate` for a batch of texts at once, the way a batch handler is written: one
        encoder call over the padded batch, then one decoder step per step for the live
        hypotheses of every text (`memory_index` points each at its text's memory); the same
        search rules per text as `translate`, so the answers are the same."""
        rows = [self.encode(t) for t in texts]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
        src = np.zeros((len(rows), int(lengths.max())), dtype=np.int64)  # (B, S)
        for i, r in enumerate(rows):
            src[i, : len(r)] = r
        memory, mask, state, keys = self._encode_batch(src, lengths)
        caps = [max(1, min(self.max_decode, 2 * len(r) + 10)) for r in rows]
        k = np.array([min(2 * beam + 1, self.vocab_size)], dtype=np.int64)
        # per text: its live hypotheses (tokens, log-prob) and best finished one
        live: list[list[tuple[list[int], float]]] = [[([], 0.0)] for _ in rows]
        best: list[tuple[float, list[int]] | None] = [None] * len(rows)
        owner = np.arange(len(rows), dtype=np.int64)  # (R,) text of each live row
        prev = np.full(len(rows), self.bos_id, dtype=np.int64)  # (R,)
        while len(owner):
            state, top_lp, top_ids, _ = self.step.run(None, {
                "prev_ids": prev, "state": state, "memory": memory, "src_mask": mask,
                "memory_index": owner, "k": k, **keys})
            keep_rows: list[int] = []
            keep_tok: list[int] = []
            at = 0
            for text in dict.fromkeys(owner.tolist()):
                hyps = live[text]
                n = len(hyps)
                lp_rows = np.array([lp for _, lp in hyps])  # (n,)
                cand = (lp_rows[:, None] + top_lp[at: at + n]).ravel()  # (n * k,)
                ids = top_ids[at: at + n].ravel()
                order = np.argsort(-cand, kind="stable")[: 2 * beam]
                kept: list[tuple[list[int], float]] = []
                for rank, c in enumerate(order):
                    row, tok, lp = int(c) // top_lp.shape[1], int(ids[c]), float(cand[c])
                    done = best[text]
                    if tok == self.eos_id:
                        if rank < beam and (done is None or lp > done[0]):
                            best[text] = (lp, [*hyps[row][0], tok])
                        continue
                    if len(kept) < beam:
                        kept.append(([*hyps[row][0], tok], lp))
                        keep_rows.append(at + row)
                        keep_tok.append(tok)
                length = len(hyps[0][0]) + 1
                finished = False
                if length >= caps[text]:
                    for toks, lp in kept:
                        done = best[text]
                        if done is None or lp > done[0]:
                            best[text] = (lp, toks)
                    finished = True
                else:
                    done = best[text]
                    finished = done is not None and (
                        not kept or min(max(lp for _, lp in kept), 0.0) <= done[0])
                if finished:
                    del keep_rows[len(keep_rows) - len(kept):]
                    del keep_tok[len(keep_tok) - len(kept):]
                    kept = []
                live[text] = kept
                at += n
            rows_kept = np.array(keep_rows, dtype=np.int64)
            owner = owner[rows_kept]
            state, prev = state[rows_kept], np.array(keep_tok, dtype=np.int64)
        out = []
        for b in best:
            assert b is not None
            out.append(self._answer(b))
        return out
