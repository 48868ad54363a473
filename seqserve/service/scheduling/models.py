"""One served model on the scheduling side: its runtime behind a batcher or a decode scheduler.

`build_model(task, runtime, manifest, config, observer, bundle)` gives a `BatchedModel`
(classifier, tagger, feature sequences: rows through the dynamic batcher; a tagger with a CRF
decodes each batch with Viterbi, `export.crf`), a `DecodedModel` (translator:
the decode loop) or an `LMModel` (scheduling/lm.py). Each has `start()` (warm up, then
serve), `stop(timeout)` (drain) and its typed calls (`submit(...)` returns one future per row
or source). Workers hold such a model and nothing else of this layer, so the same workers
talk to a model in another process alike.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from seqserve.export.contract import GRAPHS_BY_TASK, task_spec
from seqserve.export.crf import CRF, load_crf, marginals, viterbi
from seqserve.export.manifest import BundleError, Manifest
from seqserve.service.core.errors import BadRequest, ShuttingDown
from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import Observer, Timed, pad_rows
from seqserve.service.scheduling.batcher import Batcher
from seqserve.service.scheduling.config import ModelConfig
from seqserve.service.scheduling.decoding import Decoded, DecodeLoop
from seqserve.service.scheduling.lm import LMModel
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions
from seqserve.service.scheduling.sessions import Session, SessionStore

RowCompute = Callable[[list[list[int]]], list[Any]]
"""Token rows -> one result per row (runs on the batcher's thread)."""


class RowModel(Protocol):
    """What a classifier or tagger worker needs of its model (in this process or another)."""

    def submit(self, rows: Sequence[list[int]],
               deadline: float) -> list[asyncio.Future[Timed[Any]]]: ...

    def expected_wait(self) -> float | None: ...

    def describe(self) -> dict[str, Any]: ...


class SeriesModel(Protocol):
    """What a feature-sequence worker needs of its model (in this process or another)."""

    def submit(self, rows: Sequence[np.ndarray],
               deadline: float) -> list[asyncio.Future[Timed[Any]]]: ...

    def expected_wait(self) -> float | None: ...

    def describe(self) -> dict[str, Any]: ...

    def submit_session(self, series: np.ndarray, session: str, start: bool, end: bool,
                       deadline: float, owner: str = "") -> asyncio.Future[Timed[Any]]: ...


class DecodeModel(Protocol):
    """What a translator worker needs of its model (in this process or another)."""

    def submit(self, sources: Sequence[list[int]], options: SearchOptions,
               deadline: float) -> list[asyncio.Future[Decoded]]: ...

    def expected_wait(self) -> float | None: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RowSetup:
    """What a row task's compute reads of its bundle besides its runtime."""

    pad_id: int
    """The id rows are right-padded with."""
    crf: CRF | None = None
    """A tagger's CRF (the manifest's `crf`): its rows are decoded with Viterbi."""


def classifier_rows(runtime: Runtime, setup: RowSetup) -> RowCompute:
    """Rows -> (logits (C,), attention (L,)) per row, through the `classifier` graph."""

    def compute(rows: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray]]:
        ids, lengths = pad_rows(rows, setup.pad_id)  # (B, T), (B,)
        out = runtime.run("classifier", {"input_ids": ids, "lengths": lengths})
        logits = out["logits"]  # (B, C)
        attention = out.get("attention")  # (B, T); optional in the bundle format
        if attention is None:
            attention = np.zeros(ids.shape, np.float32)
        return [(logits[i], attention[i, : lengths[i]]) for i in range(len(rows))]

    return compute


TagDecode = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]
"""A tagger graph's scores (B, T, C) and lengths (B,) -> each position's label (B, T), that
label's probability (B, T) and each row's score (B,)."""


def best_labels(log_probs: np.ndarray, lengths: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each position's most probable label on its own; a row's score is the log-probability
    of its labelling (the sum of its labels' log-probs)."""
    best = log_probs.argmax(-1)  # (B, T)
    chosen = np.take_along_axis(log_probs, best[..., None], -1)[..., 0]  # (B, T)
    valid = np.arange(log_probs.shape[1])[None, :] < lengths[:, None]  # (B, T)
    return best, np.exp(chosen), np.where(valid, chosen, 0.0).sum(-1, dtype=np.float32)


def crf_labels(crf: CRF) -> TagDecode:
    """The CRF's best labelling of each row (Viterbi) with its score, each label's
    probability its marginal under the CRF (`export.crf`)."""

    def decode(emissions: np.ndarray, lengths: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        path, score = viterbi(emissions, lengths, crf)  # (B, T), (B,)
        probs = marginals(emissions, lengths, crf)  # (B, T, C)
        return path, np.take_along_axis(probs, path[..., None], -1)[..., 0], score

    return decode


def tagger_rows(runtime: Runtime, setup: RowSetup) -> RowCompute:
    """Rows -> (label (L,), its probability (L,), the row's score (1,)) per row, through the
    `tagger` graph: each token's best label, or with a CRF the best labelling (`crf_labels`)."""
    decode = best_labels if setup.crf is None else crf_labels(setup.crf)

    def compute(rows: list[list[int]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        ids, lengths = pad_rows(rows, setup.pad_id)  # (B, T), (B,)
        scores = runtime.run("tagger", {"input_ids": ids, "lengths": lengths})["log_probs"]
        best, prob, score = decode(scores, lengths)
        return [(best[i, : lengths[i]], prob[i, : lengths[i]], score[i : i + 1])
                for i in range(len(rows))]

    return compute


@dataclass(frozen=True, eq=False)
class SessionRow:
    """A session's chunk as a batch row: its steps and the state it starts from."""

    steps: np.ndarray
    """float32 (T, D): the chunk's raw steps."""
    state: np.ndarray
    """float32 (S,): the session's state before the chunk."""

    def __len__(self) -> int:
        return len(self.steps)


SeriesCompute = Callable[[list[Any]], list[Any]]
"""Raw float series (T_i, D) or `SessionRow`s -> one result per row (runs on the batcher's
thread)."""


def series_rows(runtime: Runtime, manifest: Manifest) -> SeriesCompute:
    """Series -> (outputs (k,) or (T, k)[, new_state (S,)]) per series through the bundle's
    feature-sequence graph: each normalised by the manifest's `normalization`, right-padded
    with zeros, run from zero states (a stateful graph; a `SessionRow` from its own state: the
    sessions of many clients share one batch), and its outputs de-normalised by
    `output_scale`."""
    graph = GRAPHS_BY_TASK[manifest.task][0]
    tagger = manifest.task == "sequence-tagger"  # one result per step
    dim = int(manifest.features or 0)
    norm, scale = manifest.normalization, manifest.output_scale
    mean = np.asarray(norm["mean"], np.float32) if norm else None  # (D,)
    inv_std = 1.0 / np.asarray(norm["std"], np.float64) if norm else None  # (D,)
    out_mean = np.asarray(scale["mean"], np.float32) if scale else None  # (k,)
    out_std = np.asarray(scale["std"], np.float32) if scale else None  # (k,)
    state_dim = int(manifest.state_dim or 0)

    def compute(rows: list[Any]) -> list[tuple[np.ndarray, ...]]:
        lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))  # (B,)
        x = np.zeros((len(rows), int(lengths.max()), dim), np.float32)  # (B, T, D)
        for i, r in enumerate(rows):
            x[i, : len(r)] = r.steps if isinstance(r, SessionRow) else r
        if mean is not None and inv_std is not None:
            valid = np.arange(x.shape[1])[None, :] < lengths[:, None]  # (B, T)
            with np.errstate(over="ignore", invalid="ignore"):
                x = np.where(valid[..., None], (x - mean) * inv_std, 0.0).astype(np.float32)
        inputs: dict[str, np.ndarray] = {"features": x, "lengths": lengths}
        if state_dim:
            state = np.zeros((len(rows), state_dim), np.float32)  # (B, S)
            for i, r in enumerate(rows):
                if isinstance(r, SessionRow):
                    state[i] = r.state
            inputs["state"] = state
        out = runtime.run(graph, inputs)
        y = out["outputs"]  # (B, k) or (B, T, k)
        if out_mean is not None and out_std is not None:
            y = y * out_std + out_mean
        new_state = out.get("new_state")
        results: list[tuple[np.ndarray, ...]] = []
        for i, n in enumerate(lengths.tolist()):
            row = y[i, :n] if tagger else y[i]
            results.append((row,) if new_state is None else (row, new_state[i]))
        return results

    return compute


ROW_TASKS: dict[str, Callable[[Runtime, RowSetup], RowCompute]] = {
    "classifier": classifier_rows,
    "tagger": tagger_rows,
}


def length_buckets(max_tokens: int) -> list[int]:
    """Warm-up lengths: powers of two up to, and including, `max_tokens`."""
    out, n = [], 1
    while n < max_tokens:
        out.append(n)
        n *= 2
    return [*out, max_tokens]


class BatchedModel:
    """A classifier or tagger: token rows through a dynamic batcher, one compute per runtime
    instance (several instances: several batches in flight)."""

    def __init__(self, name: str, runtimes: Sequence[Runtime],
                 computes: Sequence[Callable[[list[Any]], list[Any]]],
                 unk_id: int, config: ModelConfig, observer: Observer | None = None,
                 warm_row: Callable[[int], Any] | None = None) -> None:
        self.runtime = runtimes[0]
        self.runtimes = list(runtimes)
        self.computes = list(computes)
        self.unk_id = unk_id
        self.warm_row = warm_row or (lambda n: [unk_id] * n)
        """A row of n steps for warm-up (token rows: unk ids; feature series: zeros)."""
        self.config = config
        self.batcher: Batcher[Any, Any] = Batcher(self.computes, config.batcher,
                                                  name=name, observer=observer)
        self.sessions: SessionStore | None = None
        """A stateful feature-sequence model's sessions (`enable_sessions`), else None."""
        self._sweeper: asyncio.Task[None] | None = None

    def enable_sessions(self, state_dim: int, observer: Observer | None = None) -> None:
        """Serve sessions of this model (its graph takes and returns a state row)."""
        self.sessions = SessionStore(state_dim, self.config.sessions, observer)

    async def start(self) -> None:
        if self.config.warmup:
            await asyncio.to_thread(self.warm_up)
        self.batcher.start()
        if self.sessions is not None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever(self.sessions))

    async def _sweep_forever(self, store: SessionStore) -> None:
        """Expire idle sessions: a pass over the live ones every quarter timeout (<= 1 s)."""
        period = max(0.05, min(1.0, store.config.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(period)
            store.sweep()

    def warm_up(self) -> None:
        """Every length bucket at batch 1 and at the largest batch the budget allows, on
        every instance."""
        cfg = self.batcher.config
        for compute in self.computes:
            for length in length_buckets(self.config.max_tokens):
                rows = max(1, min(cfg.max_batch_size, cfg.max_batch_tokens // length))
                for n in sorted({1, rows}):
                    start = time.perf_counter()
                    compute([self.warm_row(length)] * n)
                    if n > 1:  # full batches: what a queue's rows will see
                        self.batcher.cost.observe(n * length, time.perf_counter() - start)

    async def stop(self, timeout: float) -> bool:
        """Drain: every admitted row (every open session's chunk in flight) is answered."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        return await self.batcher.close(timeout)

    def describe(self) -> dict[str, Any]:
        """What runs this model (for GET /v1/models)."""
        out: dict[str, Any] = {"runtime": self.runtime.name,
                               "providers": list(self.runtime.providers),
                               "instances": len(self.runtimes)}
        if self.sessions is not None:
            cfg = self.sessions.config
            out["sessions"] = {"max_sessions": cfg.max_sessions,
                               "idle_timeout_s": cfg.idle_timeout_s,
                               "state_dim": self.sessions.state_dim,
                               "max_state_bytes": self.sessions.state_bytes()}
        return out

    def submit_session(self, series: np.ndarray, session: str, start: bool, end: bool,
                       deadline: float, owner: str = "") -> asyncio.Future[Timed[Any]]:
        """Queue one chunk of a session (`scheduling.sessions`): it runs from the session's
        state in a batch with any other rows; the future resolves to Timed((outputs,
        steps int64 (1,): the session's steps so far)). SessionNotFound, SessionBusy,
        TooManySessions, or the batcher's refusals (the session then is as it was)."""
        store = self.sessions
        if store is None:
            raise BadRequest("this model's graph has no state input and output: it serves no "
                             "sessions (send the whole series without \"session\")")
        s = store.acquire(session, start, end, owner)
        try:
            (row,) = self.batcher.submit([(SessionRow(series, s.state), len(series))],
                                         deadline)
        except BaseException:
            store.release(s, None, 0, False)
            raise
        out: asyncio.Future[Timed[Any]] = asyncio.get_running_loop().create_future()
        row.add_done_callback(lambda f: _session_done(store, s, len(series), end, f, out))
        out.add_done_callback(lambda o: row.cancel() if o.cancelled() else None)
        return out

    def submit(self, rows: Sequence[Any],
               deadline: float) -> list[asyncio.Future[Timed[Any]]]:
        """Queue token rows or feature series (all or none); one future per row."""
        return self.batcher.submit([(r, len(r)) for r in rows], deadline)

    def expected_wait(self) -> float | None:
        """Seconds a request would wait for compute now (None: not measured yet)."""
        return self.batcher.expected_wait()


def _session_done(store: SessionStore, s: Session, steps: int, end: bool,
                  row: asyncio.Future[Timed[Any]], out: asyncio.Future[Timed[Any]]) -> None:
    """A session chunk's row is done: store its state (or leave it), answer `out`."""
    if row.cancelled():
        store.release(s, None, 0, False)
        out.cancel()
        return
    exc = row.exception()
    if exc is not None:
        store.release(s, None, 0, False)
        if not out.done():
            out.set_exception(exc)
        return
    done = row.result()
    outputs, new_state = done.value[0], done.value[1]
    store.release(s, new_state, steps, end)
    if not out.done():
        out.set_result(Timed((outputs, np.array([s.steps], np.int64)), done.timing))


class DecodedModel:
    """A translator: sources through the decode scheduler, whose `submit` (sources, search
    options, deadline: all queued or none, one future each) and `expected_wait` (seconds a
    source would wait for admission now; None: not measured yet) are its own."""

    submit: Callable[[Sequence[list[int]], SearchOptions, float], list[asyncio.Future[Decoded]]]
    expected_wait: Callable[[], float | None]

    def __init__(self, runtime: Runtime, limits: DecodeLimits, unk_id: int, config: ModelConfig,
                 observer: Observer | None = None) -> None:
        self.runtime = runtime
        self.unk_id = unk_id
        self.config = config
        self.loop = DecodeLoop(runtime, limits, config.decode, observer)
        self.submit = self.loop.submit
        self.expected_wait = self.loop.expected_wait

    async def start(self) -> None:
        self.loop.start()
        if self.config.warmup:  # one short decode per source length bucket
            n = self.config.max_tokens
            lengths = sorted({1, min(8, n), n})
            await self.loop.translate([[self.unk_id] * k for k in lengths],
                                        SearchOptions(beam_size=4, max_length=3))

    async def stop(self, timeout: float) -> bool:
        """Finish admitted and queued translations within `timeout`; then fail the rest."""
        return await self.loop.drain(
            timeout, ShuttingDown("the server stopped before this translation finished"))

    def describe(self) -> dict[str, Any]:
        """What runs this model and its decoding limits (for GET /v1/models)."""
        cfg = self.loop.config
        return {"runtime": self.runtime.name, "providers": list(self.runtime.providers),
                "limits": {"max_decode_length": self.loop.limits.max_decode_length,
                           "max_live_hypotheses": cfg.max_live_hypotheses,
                           "queue_size": cfg.max_queue}}


ServedModel = BatchedModel | DecodedModel | LMModel


def decode_limits(manifest: Manifest) -> DecodeLimits:
    """A translator bundle's special ids, vocabulary and decode-length limit (the target
    side's: a bundle may have separate source and target tokenizers)."""
    tok = manifest.target
    return DecodeLimits(bos_id=tok.bos_id, eos_id=tok.eos_id, vocab_size=tok.vocab_size,
                        max_decode_length=int(manifest.limits.get("max_decode_length", 128)))


def build_model(name: str, runtimes: Runtime | Sequence[Runtime], manifest: Manifest,
                config: ModelConfig, observer: Observer | None = None,
                bundle: Path | None = None) -> ServedModel:
    """The scheduled model of `manifest.task` over its runtime instances (the task table's
    family picks the scheduler: `BUILDERS`; decode and LM models use the first instance);
    `bundle`: its folder, for the files a scheduler reads besides the graphs (a tagger's
    CRF). LookupError for a task no scheduler serves."""
    instances = [runtimes] if not isinstance(runtimes, Sequence) else list(runtimes)
    return BUILDERS[task_spec(manifest.task).family](name, instances, manifest, config,
                                                     observer, bundle)


def _ids(manifest: Manifest) -> tuple[int, int]:
    """The pad id rows are padded with and the id warm-up rows are made of."""
    tok = manifest.tokenizer
    pad_id = max(tok.pad_id, 0)  # a tokenizer without pad: any id (lengths mask it)
    return pad_id, tok.unk_id if tok.unk_id >= 0 else pad_id


def bundle_crf(manifest: Manifest, bundle: Path | None) -> CRF | None:
    """The CRF a tagger bundle carries (None without one), read and checked against its
    labels (BundleError)."""
    if manifest.crf is None:
        return None
    if bundle is None:
        raise BundleError(f"{manifest.name} {manifest.version}: its CRF ({manifest.crf.file}) "
                          "is read from the bundle's folder, which was not given")
    return load_crf(bundle / manifest.crf.file, len(manifest.labels))


def _rows_model(name: str, instances: list[Runtime], manifest: Manifest, config: ModelConfig,
                observer: Observer | None, bundle: Path | None) -> ServedModel:
    pad_id, unk_id = _ids(manifest)
    setup = RowSetup(pad_id, bundle_crf(manifest, bundle))
    rows = ROW_TASKS[manifest.task]
    return BatchedModel(name, instances, [rows(rt, setup) for rt in instances], unk_id,
                        config, observer)


def _series_model(name: str, instances: list[Runtime], manifest: Manifest,
                  config: ModelConfig, observer: Observer | None,
                  bundle: Path | None) -> ServedModel:
    dim = int(manifest.features or 1)
    model = BatchedModel(name, instances, [series_rows(rt, manifest) for rt in instances], 0,
                         config, observer, warm_row=lambda n: np.zeros((n, dim), np.float32))
    if manifest.state_dim:
        model.enable_sessions(int(manifest.state_dim), observer)
    return model


def _decode_model(name: str, instances: list[Runtime], manifest: Manifest,
                  config: ModelConfig, observer: Observer | None,
                  bundle: Path | None) -> ServedModel:
    pad_id, unk_id = _ids(manifest)
    cfg = dataclasses.replace(config, decode=dataclasses.replace(config.decode, pad_id=pad_id))
    return DecodedModel(instances[0], decode_limits(manifest), unk_id, cfg, observer)


def _lm_model(name: str, instances: list[Runtime], manifest: Manifest, config: ModelConfig,
              observer: Observer | None, bundle: Path | None) -> ServedModel:
    return LMModel(instances[0], manifest, config, observer)


BUILDERS: dict[str, Callable[[str, list[Runtime], Manifest, ModelConfig, Observer | None,
                              Path | None], ServedModel]] = {
    "rows": _rows_model, "series": _series_model, "decode": _decode_model, "lm": _lm_model,
}
"""The scheduler of each task family (export.contract.FAMILIES)."""
