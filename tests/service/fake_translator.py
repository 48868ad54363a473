"""A fake translator runtime in numpy, so the decode loop is tested without a model or a runtime.

`FakeTranslator` implements the `encoder` and `decoder_step` graphs of docs/contracts.md with a
tiny deterministic random RNN with dot attention. Every row is computed on its own in float64
(then cast to float32), so a row's outputs do not depend on the batch it came in. A clock in
the last state unit raises the EOS logit step by step, so hypotheses end after a few tokens.
`step_one` exposes the full-vocabulary distribution for reference searches in tests, and
`decode_with_beams` runs the vectorised search (`Beams`, beam_search.py) over it with no
decode loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from seqserve.service.scheduling.beam_search import Beams
from seqserve.service.scheduling.search import DecodeLimits, Hypothesis, SearchOptions


@dataclass
class FakeTranslator:
    """Runtime-compatible fake (`run(graph, inputs) -> outputs`); see module doc."""

    vocab_size: int = 24
    dim: int = 8
    seed: int = 0
    eos_slope: float = 0.6
    """EOS logit grows by this per step (higher: shorter outputs)."""
    delay: float = 0.0
    """Seconds each call sleeps (to hold requests mid-decode in tests)."""
    fail_if: Callable[[str, dict[str, np.ndarray]], bool] | None = None
    """Raise RuntimeError when it returns True for (graph, inputs)."""
    name: str = "fake"
    providers: list[str] = field(default_factory=lambda: ["numpy"])
    calls: list[tuple[str, int]] = field(default_factory=list)
    """(graph, rows) of every call, in order."""

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        v, d = self.vocab_size, self.dim
        self.emb = rng.normal(0, 1, (v, d))  # (V, D)
        self.w_in, self.w_rec = rng.normal(0, 0.6, (d, d)), rng.normal(0, 0.6, (d, d))
        self.w_q, self.w_prev = rng.normal(0, 0.6, (d, d)), rng.normal(0, 0.6, (d, d))
        self.w_state, self.w_ctx = rng.normal(0, 0.6, (d, d)), rng.normal(0, 0.6, (d, d))
        self.w_out = rng.normal(0, 1.5, (d, v))  # (D, V)
        self.limits = DecodeLimits(bos_id=2, eos_id=3, vocab_size=v, max_decode_length=40)
        self._lock = threading.Lock()

    # -- single rows (the reference searches use these) -----------------------------------

    def encode_one(self, src: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """(S, D) float32 memory and (D + 1,) float32 initial state of one source."""
        h = np.zeros(self.dim)
        rows = []
        for tok in src:
            h = np.tanh(self.emb[tok] @ self.w_in + h @ self.w_rec)  # (D,)
            rows.append(h)
        memory = np.stack(rows)  # (S, D)
        state = np.append(np.tanh(memory.mean(0) @ self.w_state), 0.0)  # (D + 1,)
        return memory.astype(np.float32), state.astype(np.float32)

    def step_one(self, prev: int, state: np.ndarray,
                 memory: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Full log-probs (V,), attention (S,) and new state (D + 1,) of one row (float32)."""
        h, clock = state[:-1].astype(np.float64), float(state[-1])
        mem = memory.astype(np.float64)  # (S, D)
        scores = mem @ (h @ self.w_q)  # (S,)
        attn = np.exp(scores - scores.max())
        attn /= attn.sum()  # (S,)
        new_h = np.tanh(self.emb[prev] @ self.w_prev + h @ self.w_state + attn @ mem @ self.w_ctx)
        logits = new_h @ self.w_out  # (V,)
        logits[self.limits.eos_id] += self.eos_slope * clock - 3.0
        logits[[0, self.limits.bos_id]] = -30.0  # pad and bos are never generated
        logp = logits - logits.max()
        logp -= np.log(np.exp(logp).sum())
        new_state = np.append(new_h, clock + 1.0)
        return logp.astype(np.float32), attn.astype(np.float32), new_state.astype(np.float32)

    # -- the Runtime interface ------------------------------------------------------------

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self._lock:
            rows = len(inputs["src_ids"] if graph == "encoder" else inputs["prev_ids"])
            self.calls.append((graph, rows))
        if self.delay:
            time.sleep(self.delay)
        if self.fail_if is not None and self.fail_if(graph, inputs):
            raise RuntimeError(f"injected fault in {graph}")
        if graph == "encoder":
            return self._encoder(inputs)
        if graph == "decoder_step":
            return self._decoder_step(inputs)
        raise KeyError(f"no graph {graph!r}")

    def _encoder(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        src, lengths = inputs["src_ids"], inputs["src_lengths"]  # (B, S), (B,)
        memory = np.zeros((*src.shape, self.dim), np.float32)  # (B, S, D)
        state = np.zeros((len(src), self.dim + 1), np.float32)  # (B, D + 1)
        for b, n in enumerate(lengths):
            memory[b, :n], state[b] = self.encode_one(list(src[b, :n]))
        mask = np.arange(src.shape[1])[None] < lengths[:, None]  # (B, S)
        return {"memory": memory, "src_mask": mask, "state": state}

    def _decoder_step(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        prev, state = inputs["prev_ids"], inputs["state"]  # (R,), (R, D + 1)
        memory, mask, index = inputs["memory"], inputs["src_mask"], inputs["memory_index"]
        k = int(inputs["k"][0])
        rows, src_len = len(prev), memory.shape[1]
        new_state = np.zeros_like(state)
        top_lp = np.zeros((rows, k), np.float32)
        top_ids = np.zeros((rows, k), np.int64)
        attention = np.zeros((rows, src_len), np.float32)
        for r in range(rows):
            n = int(mask[index[r]].sum())
            logp, attn, new_state[r] = self.step_one(int(prev[r]), state[r], memory[index[r], :n])
            order = np.argsort(-logp, kind="stable")[:k]
            top_lp[r], top_ids[r], attention[r, :n] = logp[order], order, attn
        return {"new_state": new_state, "topk_logprobs": top_lp, "topk_ids": top_ids,
                "attention": attention}


def decode_with_beams(fake: FakeTranslator, jobs: list[tuple[list[int], SearchOptions]],
                      on_step: Callable[[Beams], None] | None = None,
                      kernel: bool | None = None,
                      ) -> tuple[list[list[Hypothesis]], list[int]]:
    """Decode `jobs` together in one `Beams` over full-vocabulary steps of the fake, with no
    decode loop around it: each request's n-best and the steps it took.

    `on_step(beams)` runs before every step (live rows as they are); `kernel` as `Beams`'s.
    """
    beams = Beams(fake.limits, kernel=kernel)
    encoded = [fake.encode_one(src) for src, _ in jobs]
    width = max(len(src) for src, _ in jobs)
    beams.join(list(range(len(jobs))), [o for _, o in jobs], [len(s) for s, _ in jobs])
    beams.set_source_width(width)
    state = np.stack([e[1] for e in encoded])  # (R, D + 1)
    results: dict[int, list[Hypothesis]] = {}
    steps: dict[int, int] = {}
    while len(beams):
        beams.prepare()
        keys = beams.reqs.key[beams.rows.request].tolist()  # (R,)
        outs = [fake.step_one(int(p), s, encoded[key][0])
                for p, s, key in zip(beams.prev_ids(), state, keys, strict=True)]
        logp = np.stack([o[0] for o in outs])  # (R, V)
        order = np.argsort(-logp, axis=1, kind="stable")  # (R, V) full vocabulary, best first
        attention = np.zeros((len(outs), width), np.float32)  # (R, S)
        for r, o in enumerate(outs):
            attention[r, : len(o[1])] = o[1]
        if on_step is not None:
            on_step(beams)
        parents = beams.step(np.take_along_axis(logp, order, 1), order, attention)
        state = np.stack([o[2] for o in outs])[parents]  # (R', D + 1)
        done = np.flatnonzero(beams.done)
        for q, hyps in zip(done.tolist(), beams.results(done), strict=True):
            results[int(beams.reqs.key[q])] = hyps
            steps[int(beams.reqs.key[q])] = int(beams.reqs.steps[q])
        if len(done):  # done requests keep no rows
            beams.keep(~beams.done)
    return [results[i] for i in range(len(jobs))], [steps[i] for i in range(len(jobs))]
