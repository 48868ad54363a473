"""Each task's OIP face: its input/output tensor signature and its infer on decoded inputs.

Every task takes one input `text` (BYTES [n]). Outputs: classifier `label` BYTES [n] and
`probabilities` FP32 [n, C]; tagger `tags` BYTES [n] (each the JSON string of that text's
token list, the v1 `tokens`); translator `translation` BYTES [n] and `score` FP32 [n], with
the v1 search options as request `parameters`. Feature-sequence models take `features` FP32
[n, T, dim] (right-padded) and an optional `lengths` INT64 [n] or [n, 1] (default: every row
T steps) and answer `outputs` FP32 [n, k] or [n, T, k] (zeros past each row's length)
and, with labels, `probabilities` alike (and a sequence classifier's `label` BYTES [n]). A
stateful one also
takes a session as the request parameters `sequence_id` (string or uint64), `sequence_start`
and `sequence_end` (Triton's spelling; one series per request), answered with the parameters
`sequence_id` and `sequence_steps` (the session's steps so far). Or its state travels as a
value: the parameter `return_state` answers the output `state` BYTES [1] (a state token) and
an input `state` BYTES [1] continues one series from a token (`sequence_steps` then counts
the steps since the series began); neither is in the metadata, which names what every
request has. A language model takes
`text_input` BYTES [n] (its prompts) with the generate extension's parameters and answers
`text_output` BYTES [n]. Texts may also come shaped [n, 1], as Triton's examples send them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from seqserve.service.api.common import describe_errors
from seqserve.service.api.lifecycle import Call, answer
from seqserve.service.api.oip.codec import (
    V2Tensor,
    check_outputs,
    check_target,
    decode_inputs,
    input_texts,
    request_parameters,
    timeout_s,
)
from seqserve.service.api.oip.generate import GenerateParameters
from seqserve.service.api.oip.schemas import V2InferRequest
from seqserve.service.api.translate import TranslateOptions
from seqserve.service.core.answers import encode_json
from seqserve.service.core.errors import BadRequest
from seqserve.service.core.state_token import StateCodec
from seqserve.service.repository.entries import ModelEntry
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import ModelWorker, RequestContext
from seqserve.service.workers.classifier import ClassifierWorker
from seqserve.service.workers.lm import LMWorker
from seqserve.service.workers.series import SeriesWorker
from seqserve.service.workers.tagger import TaggerWorker
from seqserve.service.workers.translator import TranslatorWorker

LM_INPUT = [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}]
"""A language model's infer input: its prompts (the generate extension's name)."""
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
"""Triton's sequence-batcher parameters: a session's id (string or uint64) and its flags."""
Signature = tuple[list[dict[str, Any]], list[dict[str, Any]]]
TEXT_INPUT = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
InferAnswer = dict[str, Any] | None
"""The answer's own `parameters` an infer fills (a session's id and steps), or None."""


def _series_signature(worker: SeriesWorker) -> Signature:
    k = worker.outputs
    shape = [-1, -1, k] if worker.per_step else [-1, k]
    outs = [{"name": "outputs", "datatype": "FP32", "shape": shape}]
    if worker.labels:
        outs.append({"name": "probabilities", "datatype": "FP32", "shape": shape})
        if not worker.per_step:
            outs.append({"name": "label", "datatype": "BYTES", "shape": [-1]})
    return [{"name": "features", "datatype": "FP32", "shape": [-1, -1, worker.features]},
            {"name": "lengths", "datatype": "INT64", "shape": [-1]}], outs


def _classifier_signature(worker: ClassifierWorker) -> Signature:
    return TEXT_INPUT, [
        {"name": "label", "datatype": "BYTES", "shape": [-1]},
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(worker.labels)]},
    ]


def _no_parameters(parameters: dict[str, Any]) -> None:
    if parameters:
        raise BadRequest(f"unknown parameters {sorted(parameters)}: this model takes none")


async def _infer_classifier(worker: ClassifierWorker, inputs: dict[str, V2Tensor],
                            parameters: dict[str, Any], call: RequestContext,
                            answer: InferAnswer, states: StateCodec) -> list[V2Tensor]:
    texts = input_texts(inputs)
    _no_parameters(parameters)
    probs = await worker.probabilities(texts, call)  # (n, C)
    labels = [worker.labels[int(j)] for j in probs.argmax(axis=1)]
    n, c = probs.shape
    return [V2Tensor("label", "BYTES", [n], labels),
            V2Tensor("probabilities", "FP32", [n, c], probs.reshape(-1).tolist())]


async def _infer_tagger(worker: TaggerWorker, inputs: dict[str, V2Tensor],
                        parameters: dict[str, Any], call: RequestContext,
                        answer: InferAnswer, states: StateCodec) -> list[V2Tensor]:
    texts = input_texts(inputs)
    _no_parameters(parameters)
    tagged = await worker.tag(texts, call)
    # each element is JSON text itself: the one encoder's (a NaN probability is null)
    data = [encode_json(r["tokens"]).decode() for r in tagged]
    return [V2Tensor("tags", "BYTES", [len(data)], data)]


async def _infer_translator(worker: TranslatorWorker, inputs: dict[str, V2Tensor],
                            parameters: dict[str, Any], call: RequestContext,
                            answer: InferAnswer, states: StateCodec) -> list[V2Tensor]:
    texts = input_texts(inputs)
    options = TranslateOptions.from_parameters(parameters).search_options()
    results = await worker.translate(texts, options, call)
    n = len(results)
    return [V2Tensor("translation", "BYTES", [n], [r["translation"] for r in results]),
            V2Tensor("score", "FP32", [n], [float(r["score"]) for r in results])]


async def _infer_series_task(worker: SeriesWorker, inputs: dict[str, V2Tensor],
                             parameters: dict[str, Any], call: RequestContext,
                             answer: InferAnswer, states: StateCodec) -> list[V2Tensor]:
    """A feature-sequence model's infer: stateless series, a session's chunk (Triton's
    sequence parameters) or one series carried by state tokens."""
    given = dict(parameters)
    session = sequence_of(given)  # removes the sequence parameters from `given`
    return_state = given.pop("return_state", False)
    if given:
        raise BadRequest(f"unknown parameters {sorted(given)}: this model takes only "
                         f"{[*SEQUENCE_PARAMETERS, 'return_state']}")
    if "state" in inputs or return_state is not False:
        if session is not None:
            raise BadRequest("a state token carries the series' state in the request: "
                             "not with parameters.sequence_id (the server keeps a "
                             "sequence's state)")
        tensors, steps = await _infer_carried(worker, inputs, return_state, states, call)
        if answer is not None:
            answer.update(sequence_steps=steps)
        return tensors
    if session is not None:
        tensors, steps, ran = await _infer_session(worker, inputs, session, call)
        if answer is not None:  # VERSION_KEY: the session's version names the answer
            answer.update(sequence_id=parameters["sequence_id"], sequence_steps=steps)
            answer[VERSION_KEY] = ran
        return tensors
    return await _infer_series(worker, inputs, call)


async def _infer_lm_task(worker: LMWorker, inputs: dict[str, V2Tensor],
                         parameters: dict[str, Any], call: RequestContext,
                         answer: InferAnswer, states: StateCodec) -> list[V2Tensor]:
    return await _infer_lm(worker, inputs, parameters, call, states)


@dataclass(frozen=True)
class Face:
    """A task's OIP face: its metadata signature and its infer on decoded inputs."""

    signature: Callable[[Any], Signature]
    infer: Callable[[Any, dict[str, V2Tensor], dict[str, Any], RequestContext, InferAnswer,
                     StateCodec], Awaitable[list[V2Tensor]]]


_SERIES = Face(_series_signature, _infer_series_task)
FACES: dict[str, Face] = {
    "classifier": Face(_classifier_signature, _infer_classifier),
    "tagger": Face(lambda w: (TEXT_INPUT, [{"name": "tags", "datatype": "BYTES",
                                            "shape": [-1]}]), _infer_tagger),
    "translator": Face(lambda w: (TEXT_INPUT, [
        {"name": "translation", "datatype": "BYTES", "shape": [-1]},
        {"name": "score", "datatype": "FP32", "shape": [-1]}]), _infer_translator),
    "lm": Face(lambda w: (LM_INPUT, [{"name": "text_output", "datatype": "BYTES",
                                      "shape": [-1]}]), _infer_lm_task),
    "sequence-classifier": _SERIES,
    "sequence-tagger": _SERIES,
}
"""The task table's OIP column (export.contract.TASK_SPECS), by the worker's task."""


def _face(worker: ModelWorker) -> Face:
    face = FACES.get(worker.task)
    if face is None:
        raise BadRequest(f"no OIP inference for task {worker.task!r}")
    return face


def signature(worker: ModelWorker) -> Signature:
    """OIP metadata `inputs` and `outputs` ([{name, datatype, shape}]) of a worker's task."""
    return _face(worker).signature(worker)


def output_names(worker: ModelWorker) -> list[str]:
    """The names of the outputs a worker's task produces (a stateful series model's `state`
    too, answered with `return_state`)."""
    names = [o["name"] for o in signature(worker)[1]]
    return [*names, "state"] if isinstance(worker, SeriesWorker) and worker.stateful else names


async def infer(worker: ModelWorker, inputs: dict[str, V2Tensor], parameters: dict[str, Any],
                call: RequestContext, answer: InferAnswer = None,
                states: StateCodec | None = None) -> list[V2Tensor]:
    """Run the worker's task on the decoded inputs; BadRequest for what does not fit it.
    The answer's own `parameters` (a session's id and steps) go into `answer`; `states`
    signs and checks state tokens (None: a server without a secret)."""
    return await _face(worker).infer(worker, inputs, parameters, call, answer,
                                     states or StateCodec([]))


async def _infer_lm(worker: LMWorker, inputs: dict[str, V2Tensor], parameters: dict[str, Any],
                    call: RequestContext, states: StateCodec) -> list[V2Tensor]:
    """A language model's infer: each `text_input` prompt's generation (the generate
    extension's parameters, Triton's names), as `text_output` BYTES [n]; with
    `parameters.return_state` also each sequence's state token as `state` BYTES [n]; a
    `state` BYTES [1] input continues that sequence (one prompt, possibly empty)."""
    given = dict(parameters)
    return_state = given.pop("return_state", False)
    if not isinstance(return_state, bool):
        raise BadRequest("parameters.return_state must be true or false")
    token = inputs.get("state")
    rest = {k: v for k, v in inputs.items() if k != "state"}
    prompts = input_texts(rest, "text_input") if token is None else _one_text(rest)
    try:
        params = GenerateParameters.model_validate(given).params()
    except ValidationError as exc:
        raise BadRequest(f"bad parameters: {describe_errors(exc.errors())}") from exc
    extra: dict[str, Any] = {}
    if return_state:
        states.require("return_state")
        params = dataclasses.replace(params, return_state=True)
        extra["issue"] = states.encode
    if token is not None:
        extra["resume"] = states.decode(input_texts({"state": token}, "state")[0])
    generation = worker.start(prompts, params, call, **extra)
    await generation.run()
    texts = [s.text for s in generation.seqs]
    out = [V2Tensor("text_output", "BYTES", [len(texts)], texts)]
    if return_state:
        out.append(V2Tensor("state", "BYTES", [len(texts)],
                            [s.state or "" for s in generation.seqs]))
    return out


def _one_text(inputs: dict[str, V2Tensor]) -> list[str]:
    """The one prompt after a state: `text_input` BYTES [1] (possibly empty)."""
    text = inputs.get("text_input")
    if text is None or len(inputs) != 1 or text.datatype != "BYTES" or len(text.data) != 1:
        raise BadRequest("with a state input: exactly one more input, text_input BYTES [1] "
                         "(the text after the state, possibly empty)")
    x = text.data[0]
    return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)]


def series_inputs(worker: SeriesWorker, inputs: dict[str, V2Tensor]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`features` FP32 [n, T, dim] and optional `lengths` INT64 [n] or [n, 1] (Triton's
    shape of a batched scalar; each 1..T) as arrays."""
    extra = sorted(set(inputs) - {"features", "lengths"})
    if "features" not in inputs or extra:
        raise BadRequest(f"expected inputs 'features' (FP32 [n, steps, {worker.features}]) and "
                         f"optionally 'lengths' (INT64 [n]), got {sorted(inputs)}")
    feats = inputs["features"]
    if feats.datatype != "FP32":
        raise BadRequest(f"input 'features' must be FP32, got {feats.datatype}")
    if len(feats.shape) != 3 or feats.shape[2] != worker.features:
        raise BadRequest(f"input 'features' must have shape [n, steps, {worker.features}], got "
                         f"{feats.shape}")
    n, steps, _ = feats.shape
    if n < 1 or steps < 1:
        raise BadRequest(f"input 'features' has shape {feats.shape}: at least one series of "
                         "one step")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in feats.data):
        raise BadRequest("input 'features' holds a value that is not a number")
    x = np.asarray(feats.data, dtype=np.float64).reshape(feats.shape)
    given = inputs.get("lengths")
    if given is None:
        return x, np.full(n, steps, np.int64)
    if given.datatype not in ("INT64", "INT32") or given.shape not in ([n], [n, 1]):
        raise BadRequest(f"input 'lengths' must be INT64 with shape [{n}] or [{n}, 1] (one per "
                         f"series), got {given.datatype} {given.shape}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in given.data):
        raise BadRequest("input 'lengths' must hold integers")
    lengths = np.asarray(given.data, np.int64)
    bad = np.flatnonzero((lengths < 1) | (lengths > steps))
    if bad.size:
        i = int(bad[0])
        raise BadRequest(f"lengths[{i}] is {int(lengths[i])}: each length is 1 to the padded "
                         f"steps ({steps})")
    return x, lengths


async def _infer_carried(worker: SeriesWorker, inputs: dict[str, V2Tensor], return_state: Any,
                         codec: StateCodec, call: RequestContext
                         ) -> tuple[list[V2Tensor], int]:
    """One series carried by state tokens (module doc): from the input `state`'s token (if
    given), the output `state` with `return_state`; and the steps since the series began."""
    inputs = dict(inputs)
    given = inputs.pop("state", None)
    token: Any = None
    if given is not None:
        if given.datatype != "BYTES" or len(given.data) != 1:
            raise BadRequest(f"input 'state' must be BYTES with one element (a state token), "
                             f"got {given.datatype} {given.shape}", param="state")
        token = given.data[0]
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise BadRequest("input 'state' is not a state token (not ASCII)",
                                 param="state") from None
    x, lengths = series_inputs(worker, inputs)
    start = worker.check_carried(codec, token, return_state, x.shape[0])
    result, steps = await worker.predict_carried([x[0, : int(lengths[0])]], start,
                                                 return_state, codec, call)
    out = _result_tensors(worker, result)
    if return_state:
        out.append(V2Tensor("state", "BYTES", [1], [result["state"]]))
    return out, steps


def _result_tensors(worker: SeriesWorker, result: dict[str, Any]) -> list[V2Tensor]:
    """One series' v1 result as the OIP outputs of a batch of one."""
    y = np.asarray(result["outputs"], np.float32)[None]  # (1, k) or (1, T, k)
    out = [V2Tensor("outputs", "FP32", list(y.shape), y.reshape(-1).tolist())]
    if "probabilities" in result:
        probs = np.asarray(result["probabilities"], np.float32)[None]
        out.append(V2Tensor("probabilities", "FP32", list(probs.shape),
                            probs.reshape(-1).tolist()))
        if not worker.per_step:
            out.append(V2Tensor("label", "BYTES", [1], [result["label"]]))
    return out


async def _infer_series(worker: SeriesWorker, inputs: dict[str, V2Tensor],
                        call: RequestContext) -> list[V2Tensor]:
    x, lengths = series_inputs(worker, inputs)
    y, probs = await worker.infer(x, lengths, call)
    out = [V2Tensor("outputs", "FP32", list(y.shape), y.reshape(-1).tolist())]
    if probs is not None:
        out.append(V2Tensor("probabilities", "FP32", list(probs.shape),
                            probs.reshape(-1).tolist()))
        if not worker.per_step:
            out.append(V2Tensor("label", "BYTES", [len(probs)],
                                [worker.labels[int(j)] for j in probs.argmax(axis=1)]))
    return out


def sequence_of(parameters: dict[str, Any]) -> tuple[str, bool, bool] | None:
    """The session named by the OIP parameters (removed from `parameters`): (id, start, end),
    or None when there is no `sequence_id`; BadRequest for a wrong type."""
    sid = parameters.pop("sequence_id", None)
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = parameters.pop(name, False)
        if not isinstance(value, bool):
            raise BadRequest(f"parameters.{name} must be true or false")
        flags.append(value)
    if sid is None:
        if any(flags):
            raise BadRequest("sequence_start and sequence_end belong to a session: give "
                             "parameters.sequence_id")
        return None
    if isinstance(sid, bool) or not isinstance(sid, str | int):
        raise BadRequest("parameters.sequence_id must be a string or an unsigned integer")
    if isinstance(sid, int):
        if not 0 < sid < 2**64:
            raise BadRequest("parameters.sequence_id must be an unsigned 64-bit integer > 0")
        sid = str(sid)
    return sid, flags[0], flags[1]


async def _infer_session(worker: SeriesWorker, inputs: dict[str, V2Tensor],
                         session: tuple[str, bool, bool], call: RequestContext
                         ) -> tuple[list[V2Tensor], int, int]:
    """One chunk of a session (a single series): the outputs as `_infer_series`'s, the
    session's steps so far and the version that ran it (the session's, which after a swap
    may not be the default)."""
    sid, start, end = session
    worker.check_session(sid, start, end)
    x, lengths = series_inputs(worker, inputs)
    if x.shape[0] != 1:
        raise BadRequest(f"a request with a sequence_id sends exactly one series (its next "
                         f"chunk), not {x.shape[0]}")
    result, steps = await worker.predict_session([x[0, : int(lengths[0])]], sid, start, end,
                                                 call)
    return _result_tensors(worker, result), steps, int(result["version"])


VERSION_KEY = "_version"
"""In an infer's answer parameters: the version that answered when it is not the entry's (a
session's); the transports name it as `model_version` and do not echo the key."""


def answered_version(entry: ModelEntry, parameters: dict[str, Any] | None) -> str:
    """The answer's `model_version` (`VERSION_KEY`, popped from `parameters`)."""
    ran = parameters.pop(VERSION_KEY, None) if parameters else None
    return str(entry.version if ran is None else ran)


Parsed = tuple[V2InferRequest, bytes | None]
"""An infer request as its transport decoded it: the request and its binary tail."""


async def run_infer(state: AppState, call: Call, parse: Callable[[Call], Parsed]
                    ) -> tuple[ModelEntry, V2InferRequest, list[V2Tensor], list[str],
                               dict[str, Any]]:
    """One infer request through the one lifecycle, whatever its transport (HTTP's JSON or
    binary body, gRPC's message): `parse(call)` once the model is known, the body's target
    and deadline read, the inputs decoded after shedding; its entry, request, outputs, the
    outputs asked for and the answer's own parameters."""
    found: dict[str, Any] = {}

    def read(call: Call) -> None:
        found["req"], found["tail"] = parse(call)
        check_target(found["req"], call.model, call.version)
        call.asked_s = timeout_s(found["req"])

    def check(worker: Any) -> None:  # after shedding, before the inputs' decoding
        req = found["req"]
        found["inputs"] = decode_inputs(req, found["tail"])
        found["asked"] = check_outputs(req, output_names(worker))
        found["parameters"] = request_parameters(req)

    extra: dict[str, Any] = {}
    entry, outputs = await answer(
        state, call, None, lambda w, ctx: infer(w, found["inputs"], found["parameters"], ctx,
                                                extra, state.states),
        check=check, read=read)
    return entry, found["req"], outputs, found["asked"], extra
