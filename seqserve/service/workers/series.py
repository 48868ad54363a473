"""Feature-sequence workers: float series in (one feature vector per step), outputs per series
(`sequence-classifier`) or per step (`sequence-tagger`) out.

Every protocol goes through `SeriesWorker.check`, the one input contract of these tasks: the
number of series (1 to the server's `max_texts`), each series' steps (1 to the model's step
limit: the server's `max_tokens` capped by the bundle's `max_steps`), every step exactly
`features` numbers wide, every number finite in float32 (NaN, infinities and values beyond
float32's range are 400s). The engine normalises, pads, runs and de-normalises
(`scheduling.models.series_rows`); a bundle with labels also answers each output's label and
probabilities (softmax over the k outputs).

A stateful bundle's series also travels as a value (`predict_carried`): one series run from a
state token's state (or from zeros) answers, with `return_state`, the signed token of the
state after its last step (`core.state_token`, KIND_SERIES; position = every step consumed
since the series began), so that any replica with the same bundle and secret continues it.
The API process signs and checks tokens; the model (in-process or in the engine) sees only the
state's floats (a `scheduling.models.SessionRow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from seqserve.export.manifest import Manifest
from seqserve.service.core.errors import BadRequest
from seqserve.service.core.state_token import (
    KIND_SERIES,
    Identity,
    StateCodec,
    StateValue,
    bundle_identity,
    check_identity,
)
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.models import SeriesModel, SessionRow
from seqserve.service.scheduling.sessions import MAX_SESSION_ID

__all__ = ["F32_MAX", "MAX_SESSION_ID", "SequenceClassifierWorker",
           "SequenceTaggerWorker", "SeriesContext", "SeriesLimits", "SeriesWorker"]
from seqserve.service.workers.base import RequestContext

F32_MAX = float(np.finfo(np.float32).max)
"""The largest finite float32: a value beyond it has no float32 (a 400)."""


@dataclass(frozen=True)
class SeriesLimits:
    """The input limits of one feature-sequence model."""

    max_series: int
    """Most series in one request (the server's `max_texts`)."""
    max_steps: int
    """Most steps in one series (the server's `max_tokens`, capped by the bundle)."""


@dataclass
class SeriesContext:
    """Everything a feature-sequence worker is built from."""

    name: str
    version: int
    manifest: Manifest
    limits: SeriesLimits
    model: SeriesModel
    sessions_refused: str | None = None
    """Why this server serves no sessions even for a stateful bundle (the replicated layout
    with several API processes: a session's state would live in one of them), else None."""


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z.astype(np.float64) - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class SeriesWorker:
    """Serves one feature-sequence bundle version (see module doc)."""

    task: ClassVar[str] = ""
    per_step: ClassVar[bool] = False

    def __init__(self, ctx: SeriesContext) -> None:
        self.ctx = ctx
        m = ctx.manifest
        self.features = int(m.features or 0)
        self.outputs = int(m.outputs or 0)
        self.labels = list(m.labels)

    def check(self, series: Sequence[Any]) -> list[np.ndarray]:
        """The one input contract (module doc): series -> float32 (T_i, D) arrays, or
        BadRequest naming the series, the step and the limit."""
        limits = self.ctx.limits
        if not isinstance(series, list | tuple) or not series:
            raise BadRequest("no series: send at least one")
        if len(series) > limits.max_series:
            raise BadRequest(f"too many series: {len(series)} > max_texts {limits.max_series}")
        return [self._one(s, i) for i, s in enumerate(series)]

    def _too_long(self, i: int, steps: int) -> str:
        """Series i is over the limit: which limit, and the flag that sets it."""
        served = self.ctx.limits.max_steps
        bundle = int(self.ctx.manifest.limits.get("max_steps", served))
        why = (f"the server's --max-tokens {served} caps this bundle's max_steps {bundle}: "
               f"serve with --max-tokens {bundle} to accept up to {bundle}" if served < bundle
               else "the bundle's max_steps, set when it was packed (seqserve pack "
               "--max-steps)")
        return f"series[{i}] has {steps} steps > the model's limit {served} ({why})"

    def _one(self, steps: Any, i: int) -> np.ndarray:
        limits = self.ctx.limits
        if isinstance(steps, np.ndarray):
            array = steps
        else:
            if not isinstance(steps, list | tuple) or not steps:
                raise BadRequest(f"series[{i}] is empty: send at least one step")
            if len(steps) > limits.max_steps:
                raise BadRequest(self._too_long(i, len(steps)))
            for j, step in enumerate(steps):
                if not isinstance(step, list | tuple) or len(step) != self.features:
                    width = len(step) if isinstance(step, list | tuple) else "not a list"
                    raise BadRequest(f"series[{i}][{j}] has {width} values; this model takes "
                                     f"{self.features} per step (a one-feature step is [x])")
            try:
                array = np.asarray(steps, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise BadRequest(f"series[{i}] holds a value that is not a number") from exc
        if array.ndim != 2 or array.shape[1] != self.features or array.shape[0] < 1:
            raise BadRequest(f"series[{i}] has shape {list(array.shape)}; this model takes "
                             f"[steps, {self.features}]")
        if array.shape[0] > limits.max_steps:
            raise BadRequest(self._too_long(i, int(array.shape[0])))
        finite = np.isfinite(array) & (np.abs(array) <= F32_MAX)
        if not finite.all():
            j, k = (int(v) for v in np.argwhere(~finite)[0])
            raise BadRequest(f"series[{i}][{j}][{k}] is {array[j, k]!r}: every value must be a "
                             "finite number within float32's range (no NaN or infinity)")
        return array.astype(np.float32)

    async def run(self, series: list[np.ndarray], call: RequestContext) -> list[np.ndarray]:
        """Each series' outputs: (k,) or (T_i, k), de-normalised."""
        futures = self.ctx.model.submit(series, call.deadline)
        done: list[Timed[tuple[np.ndarray, ...]]] = await call.wait(futures)
        return [d.value[0] for d in done]

    async def predict(self, series: Sequence[Any], call: RequestContext
                      ) -> list[dict[str, Any]]:
        """One result per series: its outputs (and label and probabilities with labels)."""
        arrays = self.check(series)
        outs = await self.run(arrays, call)
        return [self._result(a, y) for a, y in zip(arrays, outs, strict=True)]

    @property
    def stateful(self) -> bool:
        """Whether the bundle's graph takes and returns a state (it serves sessions)."""
        return bool(self.ctx.manifest.state_dim)

    def check_session(self, session: Any, start: Any, end: Any) -> str:
        """A session's id and flags as given (the v1 body's schema and the OIP parameters
        checked already agree on these rules): BadRequest naming what is wrong."""
        if not isinstance(session, str) or not 1 <= len(session) <= MAX_SESSION_ID:
            raise BadRequest(f"the session id must be a string of 1 to {MAX_SESSION_ID} "
                             "characters")
        for name, flag in (("start", start), ("end", end)):
            if not isinstance(flag, bool):
                raise BadRequest(f"{name} must be true or false")
        if not self.stateful:
            raise BadRequest(f"model {self.ctx.name!r} serves no sessions: its graph has no "
                             "state input and output (a bundle packed without --state); send "
                             "each whole series without a session")
        if self.ctx.sessions_refused is not None:
            raise BadRequest(f"model {self.ctx.name!r} serves no sessions here: "
                             f"{self.ctx.sessions_refused}; send each whole series without a "
                             "session")
        return session

    async def predict_session(self, series: Sequence[Any], session: str, start: bool,
                              end: bool, call: RequestContext) -> tuple[dict[str, Any], int]:
        """One chunk of a session (exactly one series): its result (with `version`: the
        version that ran it, the session's) and the session's steps so far
        (`scheduling.sessions` for the rules and errors). The caller checked the
        session's id and flags first (`check_session`, before any queueing)."""
        if not isinstance(series, list | tuple) or len(series) != 1:
            n = len(series) if isinstance(series, list | tuple) else "no"
            raise BadRequest(f"a request with a session sends exactly one series (its next "
                             f"chunk), not {n}")
        (array,) = self.check(series)
        future = self.ctx.model.submit_session(array, session, start, end, call.deadline,
                                               call.owner)
        (done,) = await call.wait([future])
        y, tail = done.value[0], done.value[1]
        result = self._result(array, y)
        # the engine names the version that ran it (the session's, which may not be the
        # default after a swap): the steps array is (steps, version)
        result["version"] = int(tail[1]) if len(tail) > 1 else self.ctx.version
        return result, int(tail[0])

    @cached_property
    def identity(self) -> Identity:
        """The bundle a state token of this model belongs to (`core.state_token`)."""
        return bundle_identity(self.ctx.name, self.ctx.version, self.ctx.manifest.to_dict())

    def check_carried(self, codec: StateCodec, token: Any, return_state: Any,
                      series_count: int, field: str = "state") -> StateValue | None:
        """A request's `state` token and `return_state` flag before any queueing: the token's
        verified value (None without one), or 400 (no secret, a bad token, several series, a
        model without state) / 409 (a token of another bundle or version). `field` names
        the token in errors (OIP: `input 'state'`)."""
        if not isinstance(return_state, bool):
            raise BadRequest("return_state must be true or false", param="return_state")
        if token is None and not return_state:
            return None
        asked = field if token is not None else "return_state"
        codec.require(asked)
        if not self.stateful:
            raise BadRequest(f"{asked}: model {self.ctx.name!r} has no recurrent state (its "
                             "graph has no state input and output: a bundle packed without "
                             "--state); send each whole series", param=asked)
        if series_count != 1:
            raise BadRequest(f"{asked}: a request carrying state sends exactly one series "
                             f"(the steps after the state), not {series_count}", param=asked)
        if token is None:
            return None
        value = codec.decode(token, field)
        check_identity(value, self.identity, KIND_SERIES, int(self.ctx.manifest.state_dim or 0),
                       field)
        return value

    async def predict_carried(self, series: Sequence[Any], start: StateValue | None,
                              return_state: bool, codec: StateCodec, call: RequestContext
                              ) -> tuple[dict[str, Any], int]:
        """One series run from `start`'s state (None: zeros), checked by `check_carried`:
        its result (with `return_state`, `"state"`: the token of the state after its last
        step) and the steps consumed since the series began (`start`'s position included)."""
        (array,) = self.check(series)
        position = (start.position if start is not None else 0) + int(array.shape[0])
        row: Any = array if start is None else SessionRow(
            array, np.frombuffer(start.state, "<f4").astype(np.float32))
        (done,) = await call.wait(self.ctx.model.submit([row], call.deadline))
        result = self._result(array, done.value[0])
        if return_state:
            state = np.ascontiguousarray(done.value[1], "<f4").tobytes()
            result["state"] = codec.encode(StateValue(KIND_SERIES, self.identity, position,
                                                      state))
        return result, position

    def _result(self, series: np.ndarray, y: np.ndarray) -> dict[str, Any]:
        out: dict[str, Any] = {"outputs": y.tolist(), "steps": int(series.shape[0])}
        if self.labels:
            probs = _softmax(y)
            best = probs.argmax(axis=-1)
            out["probabilities"] = probs.tolist()
            out["label"] = ([self.labels[int(j)] for j in best] if self.per_step
                            else self.labels[int(best)])
        return out

    async def infer(self, features: np.ndarray, lengths: np.ndarray, call: RequestContext
                    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The OIP face: a padded (n, T, D) batch and its lengths -> outputs (n, k) or
        (n, T, k) (zeros past each row's length) and, with labels, probabilities alike."""
        arrays = self.check([features[i, : int(n)] for i, n in enumerate(lengths.tolist())])
        outs = await self.run(arrays, call)
        n, steps = features.shape[0], features.shape[1]
        shape = (n, steps, self.outputs) if self.per_step else (n, self.outputs)
        y = np.zeros(shape, np.float32)
        probs = np.zeros(shape, np.float32) if self.labels else None
        for i, row in enumerate(outs):
            if self.per_step:
                y[i, : row.shape[0]] = row
                if probs is not None:
                    probs[i, : row.shape[0]] = _softmax(row)
            else:
                y[i] = row
                if probs is not None:
                    probs[i] = _softmax(row)
        return y, probs

    def describe(self) -> dict[str, Any]:
        m, model = self.ctx.manifest, self.ctx.model.describe()
        limits = {"max_series": self.ctx.limits.max_series,
                  "max_steps": self.ctx.limits.max_steps, **model.pop("limits", {}),
                  "bundle": dict(m.limits)}
        out: dict[str, Any] = {"features": self.features, "outputs": self.outputs,
                               "labels": self.labels, "normalized": m.normalization is not None,
                               "output_scale": m.output_scale is not None,
                               "stateful": m.state_dim is not None, "limits": limits, **model,
                               "metrics": dict(m.source_run.get("test_metrics") or {}),
                               "created": m.created}
        return out


class SequenceClassifierWorker(SeriesWorker):
    """Many-to-one: one result of k outputs per series."""

    task: ClassVar[str] = "sequence-classifier"
    per_step: ClassVar[bool] = False


class SequenceTaggerWorker(SeriesWorker):
    """Many-to-many (synced): one result of k outputs per step."""

    task: ClassVar[str] = "sequence-tagger"
    per_step: ClassVar[bool] = True
