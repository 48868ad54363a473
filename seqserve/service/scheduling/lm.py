"""Language models on the one loop driver: continuous batching of generation, step by step.

The design is the translator's (scheduler.py / decoding.py): a synchronous, model-free
scheduler (`LMScheduler`, lm_scheduler.py: schedule, execute, update; one table of requests)
driven by the one loop driver (loop.py; `LMLoop` here) that runs each work item off the
event loop.

- schedule(): evict the rows of cancelled and stopped sequences; rows whose prompts were
  prefilled join the live set; admit waiting requests (prompts to generate from, texts to
  score) while the live-sequence budget allows, as ONE `prefill` batch; and, when rows are
  live, ONE `lm_step` call that advances every live sequence of every request together;
- update(): a prefill's scored texts are answered (per-token log-probs gathered from its
  `log_probs`, and the top-k tokens at every position when asked); each prompt's n
  sequences take the prompt's state and draw their first token from the distribution at
  the prompt's last position (time to first token: one prefill); a step's rows draw their
  next tokens (`sampling.sample`: every row in a few float32 array operations, greedy rows
  by argmax, cut rows by a partition of their best tokens; each sequence's uniform comes
  from its own counter-based stream keyed by (seed, index), so a seed gives the same text
  whatever else is batched with it; the rows of requests with a logit bias, penalties or
  ignore_eos draw from their tuned copy, `sampling.tuned`); sequences that reach eos or
  their `max_new_tokens` leave. The live rows are parallel arrays (`lm_rows.Rows`) beside the
  state; a request's rows are contiguous, so the per-step Python is one loop over rows
  building events, and one sink call per request.

The prefill and the step run on two threads, so a new batch of prompts is read while the
live sequences advance. `continuous=False` admits a new batch only when every sequence of
the previous one finished (request-level batching, for comparison).

Tokens go out as they exist: every update hands each request the events of its sequences
(`TokenEvent`), through the request's `sink` (an asyncio `TokenStream` in process; with an
engine process one ZeroMQ frame per API process per step carries every request's events).
Stop strings need the text, so the worker watches for them and `stop`s a sequence; a caller
that leaves `cancel`s its request, and its rows are gone at the next schedule.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from seqserve.export.manifest import Manifest
from seqserve.service.core.errors import ShuttingDown
from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import NullObserver, Observer, Timed
from seqserve.service.scheduling.config import ModelConfig
from seqserve.service.scheduling.generation import GenerateOptions, Sink, TokenStream
from seqserve.service.scheduling.lm_scheduler import LMScheduler, Work, _Done
from seqserve.service.scheduling.loop import LoopDriver
from seqserve.service.scheduling.prefix_cache import PrefixCache
from seqserve.service.scheduling.work import DecodeConfig


class LMLoop(LoopDriver[Work, _Done]):
    """The language models' loop: an `LMScheduler` on the one loop driver (loop.py), two
    lanes (prefill, steps); requests are answered by the scheduler through their sinks."""

    scheduler: LMScheduler

    def __init__(self, runtime: Runtime, eos_id: int, vocab_size: int, config: DecodeConfig,
                 observer: Observer | None = None, takes_state: bool = False,
                 state_dim: int | None = None, cache: PrefixCache | None = None) -> None:
        self.observer: Observer = observer or NullObserver()
        self.config = config
        super().__init__(LMScheduler(runtime, eos_id, vocab_size, config, self.observer,
                                     takes_state=takes_state, state_dim=state_dim,
                                     cache=cache),
                         ["prefill", "lm-step"], config.runtime_calls == "loop")

    def submit(self, prompts: Sequence[list[int]], options: GenerateOptions,
               deadline: float | None, sink: Sink) -> int:
        """Queue prompts (bos first) for generation, their events to `sink`; the request id.
        QueueFull / ShuttingDown refuse them."""
        r = self.scheduler.add(prompts, options, sink, deadline)
        self._kick()
        return r.rid

    def cancel(self, rid: int) -> None:
        self.scheduler.cancel(rid)
        self._kick()

    def stop_sequence(self, rid: int, index: int) -> None:
        self.scheduler.stop(rid, index)
        self._kick()

    def generate(self, prompts: Sequence[list[int]], options: GenerateOptions,
                 deadline: float | None = None) -> TokenStream:
        """`submit` into a `TokenStream` (the in-process caller's view)."""
        holder: dict[str, int] = {}
        stream = TokenStream(len(prompts) * options.n, lambda: self.cancel(holder["rid"]),
                             lambda index: self.stop_sequence(holder["rid"], index))
        holder["rid"] = self.submit(prompts, options, deadline, stream.put)
        return stream

    def score(self, rows: Sequence[list[int]], deadline: float | None = None, top: int = 0,
              start: tuple[bytes, int] | None = None, return_state: bool = False
              ) -> list[asyncio.Future[Timed[Any]]]:
        """Queue texts (bos first) for one batched prefill; a future per text resolving to
        Timed((log-probs of the text's tokens,),), with `top` also the `top` best tokens at
        each of those positions: Timed((log-probs, ids (n, top) int64, their log-probs
        (n, top) float32),). `start` (flat state bytes, pending token): the texts (no bos)
        continue that state, the pending token fed first; `return_state`: each value ends
        with the state before the text's last token (S,) float32 and that token (1,) int64."""
        r = self.scheduler.add(rows, None, None, deadline)
        r.top, r.start, r.score_state = top, start, return_state
        loop = asyncio.get_running_loop()
        r.futures = [loop.create_future() for _ in rows]
        rid = r.rid

        def on_done(f: asyncio.Future[Any]) -> None:
            if f.cancelled():
                self.scheduler.cancel(rid)

        for f in r.futures:
            f.add_done_callback(on_done)
        self._kick()
        return list(r.futures)

    def _kick(self) -> None:
        self.kick()
        self.report()

    def report(self) -> None:
        self.observer.on_depth(self.scheduler.queued)
        self.observer.on_live_sequences(self.scheduler.live_rows)


class LMModel:
    """A language model: prompts and texts through one `LMLoop` (the scheduled model the
    LM worker sees, like `DecodedModel` for translators)."""

    def __init__(self, runtime: Runtime, manifest: Manifest, config: ModelConfig,
                 observer: Observer | None = None) -> None:
        tok = manifest.tokenizer
        self.runtime = runtime
        self.bos_id, self.unk_id = tok.bos_id, tok.unk_id
        self.max_tokens = config.max_tokens
        self.warmup = config.warmup
        self.config = config
        """The model's effective scheduling (its `decode` part runs the loop: one group)."""
        decode = dataclasses.replace(config.decode, pad_id=max(tok.pad_id, 0), groups=1)
        self.decode = decode
        self.takes_state = any(t.name == "initial_state"
                               for t in manifest.graphs["prefill"].inputs)
        """Its prefill continues a state in one call (else through lm_step)."""
        self.cache = PrefixCache(config.prefix_cache_bytes)
        self.loop = LMLoop(runtime, tok.eos_id, tok.vocab_size, decode, observer,
                           self.takes_state, manifest.state_dim, self.cache)

    async def start(self) -> None:
        self.loop.start()
        if self.warmup:  # the prefill over a few lengths, then a few steps
            for n in sorted({1, min(8, self.max_tokens), self.max_tokens}):
                stream = self.loop.generate([[self.bos_id] + [self.unk_id] * n],
                                            GenerateOptions(max_new_tokens=3, temperature=0.0))
                async for _ in stream:
                    pass

    async def stop(self, timeout: float) -> bool:
        return await self.loop.drain(
            timeout, ShuttingDown("the server stopped before this generation finished"))

    def describe(self) -> dict[str, Any]:
        on = self.loop.scheduler.cache is not None
        return {"runtime": self.runtime.name, "providers": list(self.runtime.providers),
                "limits": {"max_live_sequences": self.decode.max_live_hypotheses,
                           "queue_size": self.decode.max_queue},
                "prefix_cache": {"bytes": self.cache.capacity if on else 0,
                                 "block": self.cache.block} if on else {
                    "bytes": 0, "reason": "off (--prefix-cache-bytes 0)" if not
                    self.cache.enabled else "off: this bundle's prefill takes no "
                    "initial_state (re-export or re-pack it)"}}

    def generate(self, prompts: Sequence[list[int]], options: GenerateOptions,
                 deadline: float) -> TokenStream:
        """Generate from prompts (bos first); the tokens come on the returned stream."""
        return self.loop.generate(prompts, options, deadline)

    def submit(self, prompts: Sequence[list[int]], options: GenerateOptions,
               deadline: float, sink: Sink) -> int:
        """Generate from prompts, every update's events to `sink`; the request id (for
        `cancel` and `stop_sequence`)."""
        return self.loop.submit(prompts, options, deadline, sink)

    def cancel(self, rid: int) -> None:
        """Drop a generation (its caller left)."""
        self.loop.cancel(rid)

    def stop_sequence(self, rid: int, index: int) -> None:
        """End one sequence of a generation (it hit a stop string)."""
        self.loop.stop_sequence(rid, index)

    def score(self, rows: Sequence[list[int]], deadline: float, top: int = 0,
              start: tuple[bytes, int] | None = None, return_state: bool = False
              ) -> list[asyncio.Future[Timed[Any]]]:
        """Per-token log-probs of texts (bos first), with `top` the best tokens at each
        position too: one future per text (`LMLoop.score`)."""
        return self.loop.score(rows, deadline, top, start, return_state)

    def expected_wait(self) -> float | None:
        return self.loop.scheduler.expected_wait()
