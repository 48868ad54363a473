"""A plainly written reference beam search for the decode loop's tests (not its code).

It scores the WHOLE vocabulary at every step (no top-k), decodes one hypothesis row at a time
and always runs to the length cap (no early stopping), then sorts every finished hypothesis.
The rules are the ones documented in `service/scheduling/search.py`; if the search's top-k
shortcut or its early stop were wrong, its output would differ from this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.export.manifest import load_bundle
from seqserve.service.runtimes import load_runtime
from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.models import decode_limits
from seqserve.service.scheduling.search import SearchOptions, max_steps

# step(prev_id, state, memory) -> (full log-probs (V,), attention (S,), new state)
StepFn = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class RefHyp:
    tokens: list[int]
    logprob: float
    state: np.ndarray
    coverage: np.ndarray
    attention: list[np.ndarray]
    score: float = 0.0


def final_score(hyp: RefHyp, alpha: float, beta: float) -> float:
    lp = ((5 + len(hyp.tokens)) / 6) ** alpha
    cp = 0.0
    if beta:
        for c in hyp.coverage:
            cp += math.log(min(max(c, 1e-12), 1.0))
    return hyp.logprob / lp + beta * cp


def banned_tokens(tokens: list[int], n: int) -> set[int]:
    if n <= 0:
        return set()
    banned = set()
    for i in range(len(tokens) - n + 1):
        if n == 1 or tokens[i : i + n - 1] == tokens[len(tokens) - n + 1 :]:
            banned.add(tokens[i + n - 1])
    return banned


def reference_beam_search(step: StepFn, memory: np.ndarray, state: np.ndarray, *, bos: int,
                          eos: int, max_len: int, beam: int, n_best: int, alpha: float = 0.0,
                          beta: float = 0.0, min_length: int = 0,
                          no_repeat: int = 0) -> list[RefHyp]:
    live = [RefHyp([], 0.0, state, np.zeros(memory.shape[0]), [])]
    finished: list[RefHyp] = []
    for t in range(max_len):
        candidates = []
        for i, hyp in enumerate(live):
            prev = hyp.tokens[-1] if hyp.tokens else bos
            logp, attn, new_state = step(prev, hyp.state, memory)
            banned = banned_tokens(hyp.tokens, no_repeat)
            for tok in range(len(logp)):
                if (tok == eos and t < min_length) or tok in banned:
                    continue
                candidates.append((hyp.logprob + float(logp[tok]), i, tok, attn, new_state))
        candidates.sort(key=lambda c: -c[0])
        new_live: list[RefHyp] = []
        for rank, (total, i, tok, attn, new_state) in enumerate(candidates[: 2 * beam]):
            parent = live[i]
            child = RefHyp(parent.tokens + [tok], total, new_state,
                           parent.coverage + attn.astype(np.float64), parent.attention + [attn])
            if tok == eos:
                if rank < beam:
                    finished.append(child)
            elif len(new_live) < beam:
                new_live.append(child)
        if t + 1 == max_len:
            finished.extend(new_live)
            new_live = []
        live = new_live
        if not live:
            break
    for hyp in finished:
        hyp.score = final_score(hyp, alpha, beta)
    finished.sort(key=lambda h: -h.score)
    return finished[:n_best]


def onnx_reference(repo: Path, text: str, options: SearchOptions) -> list[Any]:
    """Reference beam search over the bundle's ONNX graphs, one row, full vocabulary."""
    from seqserve.models.text.tokenizer import Tokenizer

    path = repo / "tiny-mt" / "1"
    manifest = load_bundle(path)
    runtime = load_runtime(RuntimeSpec("onnx", "cpu", (), 1, 0), path, manifest)
    src = Tokenizer.load(path / "tokenizer.model").encode(text)
    enc = runtime.run("encoder", {"src_ids": np.array([src]), "src_lengths": np.array([len(src)])})
    vocab = manifest.tokenizer.vocab_size

    keys = {"keys": enc["keys"]} if "keys" in enc else {}  # projected once (schema 3)

    def step(prev: int, state: np.ndarray, memory: np.ndarray) -> tuple[Any, Any, Any]:
        out = runtime.run("decoder_step", {
            "prev_ids": np.array([prev]), "state": state[None], "memory": memory[None],
            "src_mask": np.ones((1, len(memory)), bool), "memory_index": np.array([0]),
            "k": np.array([vocab]), **keys})
        logp = np.empty(vocab, np.float32)
        logp[out["topk_ids"][0]] = out["topk_logprobs"][0]
        return logp, out["attention"][0], out["new_state"][0]

    limits = decode_limits(manifest)
    return reference_beam_search(
        step, enc["memory"][0], enc["state"][0], bos=limits.bos_id, eos=limits.eos_id,
        max_len=max_steps(options, len(src), limits), beam=options.beam_size,
        n_best=options.n_best, alpha=options.length_penalty, beta=options.coverage_penalty,
        min_length=options.min_length, no_repeat=options.no_repeat_ngram_size)
