"""KServe V1: POST /v1/models/{name}:predict (and /versions/{v}:predict), KServe's V1 data
plane (TensorFlow Serving's row format), as KServe's SDK and its InferenceService clients
send it.

The body is `{"instances": [...]}`, one instance per input, and the answer `{"predictions":
[...]}`, one prediction per instance, in order. A prediction is exactly what the model's own
v1 route answers for that input with its default options (its `results` item): a
classifier's `/classify` (label, score, top_k), a tagger's `/tag` (tagged tokens), a
translator's `/translate` (translation, score, hypotheses), a feature-sequence model's
`/predict` (outputs, steps, label and probabilities with labels). A text model's instance is
its text, a string (or `{"text": "..."}`); a feature-sequence model's is one series, its
steps of feature values (`[[x_1, ..., x_dim], ...]`). The instances become that route's body
and go through that route's answer (`lifecycle.serve`): its limits, checks, errors and
deadline are the route's; an instance the route refuses is a 422 naming `instances.{i}`.

Which route answers which task is the task table's V1 column (`V1_FACES`, keyed by the
manifest's task as `oip.tasks.FACES` is); a language model has no V1 mapping (a prompt has
no one answer without generation options): a 400 names what to use instead (`INSTEAD`).
Errors are our one error answer, `{"error": "..."}`, which is KServe V1's shape too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from seqserve.service.api import classify, predict, tag, translate
from seqserve.service.api.common import HARD_MAX_TEXTS
from seqserve.service.api.hot_path import Unprocessable
from seqserve.service.api.lifecycle import Call, Route, serve
from seqserve.service.core.errors import BadRequest
from seqserve.service.web.state import AppState

Instance = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "string", "description": "A text model's input text."},
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
     "additionalProperties": False, "description": "The same text, as an object."},
    {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
     "description": "A feature-sequence model's series: its steps of feature values."},
]})]


class V1PredictRequest(BaseModel):
    """POST /v1/models/{name}:predict body (KServe V1)."""

    model_config = ConfigDict(extra="forbid")

    instances: list[Instance] = Field(
        min_length=1, max_length=HARD_MAX_TEXTS,
        description="Inputs, 1 to max_texts of them: texts (a text model: a string or "
                    "{\"text\": ...}) or series (a feature-sequence model), each as the "
                    "model's v1 route takes one.")


class V1PredictResponse(BaseModel):
    predictions: list[classify.Classification | tag.Tagging | translate.Translation
                      | predict.Prediction] = Field(
        description="One per instance, in order: the model's v1 route's result for it.")


@dataclass(frozen=True)
class V1Face:
    """A task's KServe V1 face: the v1 route that answers it, the list field of that route's
    body the instances fill, and one instance as an item of that list."""

    route: Route
    field: str
    item: Callable[[Any], Any]


def _text(instance: Any) -> Any:
    """A text instance as a text: the string itself, or the `text` of `{"text": ...}` (any
    other value is left for the route's validation to refuse)."""
    if isinstance(instance, dict) and instance.keys() == {"text"}:
        return instance["text"]
    return instance


_SERIES = V1Face(predict.ROUTES[0], "series", lambda instance: instance)
V1_FACES: dict[str, V1Face] = {
    "classifier": V1Face(classify.ROUTES[0], "texts", _text),
    "tagger": V1Face(tag.ROUTES[0], "texts", _text),
    "translator": V1Face(translate.ROUTES[0], "texts", _text),
    "sequence-classifier": _SERIES,
    "sequence-tagger": _SERIES,
}
"""The task table's KServe V1 column (export.contract.TASK_SPECS), by the worker's task."""
INSTEAD: dict[str, str] = {
    "lm": "a language model generates text with options KServe V1 has no place for: use "
          "POST /v1/completions, /v1/models/{name}/generate or /v2/models/{name}/generate",
}
"""The tasks without a V1 face, and what to use for them instead."""


async def predict_answer(state: AppState, call: Call, body: V1PredictRequest) -> dict[str, Any]:
    """The instances' predictions (module doc): the task's v1 route's answer to them."""
    _, worker = state.repository.ready(call.model, call.version)
    face = V1_FACES.get(worker.task)
    if face is None:
        why = INSTEAD.get(worker.task, "it has no KServe V1 face")
        raise BadRequest(f"model {call.model!r} is a {worker.task}, not served by KServe V1 "
                         f"predict: {why}".replace("{name}", call.model))
    model = face.route.body
    assert model is not None
    try:
        request = model.model_validate({face.field: [face.item(i) for i in body.instances]})
    except ValidationError as exc:
        raise Unprocessable([{**e, "loc": ("body", "instances", *e["loc"][1:])}
                             for e in exc.errors()]) from exc
    reply = await serve(state, face.route, call, request)
    return {"predictions": reply["results"]}


ROUTES = [Route(
    "/v1", "predict", "kserve_predict", V1PredictRequest, answer=predict_answer, joined=":",
    response_model=V1PredictResponse,
    doc="KServe V1 predict with the default (highest ready) version: each instance's answer\n"
        "is the model's v1 route's (classify, tag, translate or predict) for it.",
    version_doc="KServe V1 predict with one version.")]
"""POST /v1/models/{name}[/versions/{v}]:predict (`lifecycle.Route`)."""
