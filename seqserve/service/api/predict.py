"""Predict: POST /v1/models/{name}/predict (and /versions/{v}/predict) for feature-sequence
models (`sequence-classifier`, `sequence-tagger`).

The body is `{"series": [[[x_1, ..., x_dim] per step] per series]}` (a one-feature step is
still a list: `[[x]]`), raw values (the server applies the bundle's normalisation). Each
series comes back as `{"outputs", "steps"}`: a list of k numbers (a sequence classifier) or
one per step (a sequence tagger), de-normalised when the bundle has an `output_scale`; a
bundle with labels adds `label` and `probabilities` (per step for a tagger).

Sessions (a bundle whose graph exports its state): `"session": "ID"` with exactly one series,
the next chunk of that session, `"start": true` on its first chunk, `"end": true` on its last;
the id may come in the `X-Session-Id` header instead (what an ingress hashes on to route a
session to its replica). The answer adds `session` and `steps` (the session's steps so far);
its `version` is the one the session runs on: the version its first chunk ran on, which stays
its version after a newer default appears (model control).
The engine keeps the state (`seqserve.service.scheduling.sessions` for the rules: 404 for an
unknown or expired session, 409 for a second chunk in flight, 429 beyond max_sessions).

State as a value (a stateful bundle, a server with `--state-secret-file`): `"return_state":
true` with exactly one series adds `"state": "<token>"` to its result, the signed state after
its last step; `"state": "<token>"` runs the one series from that state, on any replica with
the same bundle and secret (the client carries the session: no sticky routing). The answer's
`steps` then counts every step since the series began. Refused (400) with several series or a
session; a bad token or no secret 400; a token of another bundle or version 409
(`workers.series.SeriesWorker.check_carried`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat

from seqserve.service.api.common import HARD_MAX_TEXTS
from seqserve.service.api.lifecycle import Call, Route, answer
from seqserve.service.core.errors import BadRequest
from seqserve.service.web.state import AppState
from seqserve.service.workers.series import F32_MAX, MAX_SESSION_ID, SeriesWorker

HARD_MAX_STEPS = 1_000_000
"""Schema ceiling of steps per series (the model's step limit is the live one)."""
Value = Annotated[StrictFloat, Field(ge=-F32_MAX, le=F32_MAX, allow_inf_nan=False)]
"""One feature value: a finite JSON number within float32's range (an integer is a number)."""
Step = Annotated[list[Value], Field(min_length=1, description="One step: the model's "
                                    "`features` values (a one-feature step is [x]).")]
Series = Annotated[list[Step], Field(min_length=1, max_length=HARD_MAX_STEPS,
                                     description="One series: 1 to the model's max_steps "
                                     "steps, every step as wide as the model's features.")]


class PredictRequest(BaseModel):
    """POST /v1/models/{name}/predict body."""

    model_config = ConfigDict(extra="forbid")

    series: list[Series] = Field(min_length=1, max_length=HARD_MAX_TEXTS,
                                 description="Series, 1 to max_texts of them; raw values "
                                 "(the server normalises). With a session: exactly one, the "
                                 "session's next chunk.")
    session: str | None = Field(
        None, min_length=1, max_length=MAX_SESSION_ID,
        description="A stateful session (bundles whose graph exports its state): the series "
        "continues from the state this session's previous chunk left, which the server keeps. "
        "Also accepted as the X-Session-Id header. Unknown or expired: 404 (start it again "
        "with its history); a chunk of it already in flight: 409; beyond max_sessions: 429.")
    start: StrictBool = Field(False, description="With a session: its first chunk (from "
                              "zero state); on a live session it restarts it.")
    end: StrictBool = Field(False, description="With a session: its last chunk; the server "
                            "frees its state after it.")
    state: str | None = Field(
        None, min_length=1, description="A state token a previous answer returned: the one "
        "series continues from it (any replica with the same bundle and state secret). Not "
        "with a session or several series.")
    return_state: StrictBool = Field(False, description="Return the state after the one "
                                     "series as a token (`results[0].state`).")


class Prediction(BaseModel):
    outputs: list[float | None] | list[list[float | None]] = Field(
        description="k numbers (a sequence classifier) or k numbers per step (a sequence "
        "tagger); null where the model's output is not finite.")
    steps: int = Field(description="Steps of the series.")
    label: str | list[str] | None = Field(None, description="With labels: the most probable "
                                          "label (per step for a tagger).")
    probabilities: list[float] | list[list[float]] | None = Field(
        None, description="With labels: softmax over the k outputs (per step for a tagger).")
    state: str | None = Field(None, description="With return_state: the state token after "
                              "this series' last step (send it as `state` to continue).")


class PredictResponse(BaseModel):
    model: str
    version: int
    results: list[Prediction]
    session: str | None = Field(None, description="With a session: its id.")
    steps: int | None = Field(None, description="With a session or a state token: the steps "
                              "seen so far, this chunk's included.")


SESSION_HEADER = b"x-session-id"
"""The header a session id may come in (an ingress can hash on it)."""


def session_of(call: Call, body: PredictRequest) -> str | None:
    """The request's session id: the body's, else the X-Session-Id header's (400 when they
    differ or the header is not a valid id)."""
    given = call.header(SESSION_HEADER)
    if given is not None and not 1 <= len(given) <= MAX_SESSION_ID:
        raise BadRequest(f"the X-Session-Id header must be 1 to {MAX_SESSION_ID} characters")
    if body.session is not None and given is not None and given != body.session:
        raise BadRequest("the X-Session-Id header and the body's session differ")
    session = body.session if body.session is not None else given
    if session is None and (body.start or body.end):
        raise BadRequest("start and end belong to a session: give \"session\" (or the "
                         "X-Session-Id header)")
    return session


async def predict_answer(state: AppState, call: Call, body: PredictRequest) -> dict[str, Any]:
    """The answer (as plain data, the shape of PredictResponse): series, or a session's
    chunk (its check once, before any queueing)."""
    session = session_of(call, body)
    if body.state is not None or body.return_state:
        if session is not None:
            raise BadRequest("state and return_state carry the series' state in the request: "
                             "not with a session (the server keeps a session's state)",
                             param="state" if body.state is not None else "return_state")
        return await _carried(state, call, body)
    if session is None:
        entry, results = await answer(state, call, SeriesWorker,
                                      lambda w, ctx: w.predict(body.series, ctx))
        return {"model": call.model, "version": entry.version, "results": results}
    entry, (result, steps) = await answer(
        state, call, SeriesWorker, lambda w, ctx: w.predict_session(
            body.series, session, body.start, body.end, ctx),
        check=lambda w: w.check_session(session, body.start, body.end))
    # the version the session runs on (its first chunk's), not always today's default
    version = result.pop("version", entry.version)
    return {"model": call.model, "version": version, "results": [result],
            "session": session, "steps": steps}


async def _carried(state: AppState, call: Call, body: PredictRequest) -> dict[str, Any]:
    """One series carried by state tokens (module doc): checked before any queueing."""
    codec = state.states
    found: dict[str, Any] = {}

    def check(w: SeriesWorker) -> None:
        found["start"] = w.check_carried(codec, body.state, body.return_state, len(body.series))

    entry, (result, steps) = await answer(
        state, call, SeriesWorker, lambda w, ctx: w.predict_carried(
            body.series, found["start"], body.return_state, codec, ctx), check=check)
    return {"model": call.model, "version": entry.version, "results": [result],
            "steps": steps}


ROUTES = [Route(
    "/v1", "predict", "predict", PredictRequest, answer=predict_answer,
    response_model=PredictResponse,
    doc="Run a feature-sequence model on series of feature vectors (default version).",
    version_doc="Run one version of a feature-sequence model on series of feature vectors.")]
"""POST /v1/models/{name}[/versions/{v}]/predict (`lifecycle.Route`)."""
