"""Each task's OIP face: its input/output tensor signature and its infer on decoded inputs.

Every task takes one input `text` (BYTES [n]). Outputs: classifier `label` BYTES [n] and
`probabilities` FP32 [n, C]; tagger `tags` BYTES [n] (each the JSON string of that text's
token list, the v1 `tokens`); translator `translation` BYTES [n] and `score` FP32 [n], with
the v1 search options as request `parameters`.
"""

from __future__ import annotations

from typing import Any

from seqserve.service.api.oip.codec import V2Tensor, input_texts
from seqserve.service.api.translate import TranslateOptions
from seqserve.service.core.answers import encode_json
from seqserve.service.core.errors import BadRequest
from seqserve.service.workers.base import ModelWorker, RequestContext
from seqserve.service.workers.classifier import ClassifierWorker
from seqserve.service.workers.tagger import TaggerWorker
from seqserve.service.workers.translator import TranslatorWorker

Signature = tuple[list[dict[str, Any]], list[dict[str, Any]]]
TEXT_INPUT = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]


def signature(worker: ModelWorker) -> Signature:
    """OIP metadata `inputs` and `outputs` ([{name, datatype, shape}]) of a worker's task."""
    if isinstance(worker, ClassifierWorker):
        return TEXT_INPUT, [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(worker.labels)]},
        ]
    if isinstance(worker, TaggerWorker):
        return TEXT_INPUT, [{"name": "tags", "datatype": "BYTES", "shape": [-1]}]
    return TEXT_INPUT, [{"name": "translation", "datatype": "BYTES", "shape": [-1]},
                        {"name": "score", "datatype": "FP32", "shape": [-1]}]


def output_names(worker: ModelWorker) -> list[str]:
    """The names of the outputs a worker's task produces."""
    return [o["name"] for o in signature(worker)[1]]


async def infer(worker: ModelWorker, inputs: dict[str, V2Tensor], parameters: dict[str, Any],
                call: RequestContext) -> list[V2Tensor]:
    """Run the worker's task on the decoded inputs; BadRequest for what does not fit it."""
    texts = input_texts(inputs)
    if isinstance(worker, TranslatorWorker):
        options = TranslateOptions.from_parameters(parameters).search_options()
        results = await worker.translate(texts, options, call)
        n = len(results)
        return [V2Tensor("translation", "BYTES", [n], [r["translation"] for r in results]),
                V2Tensor("score", "FP32", [n], [float(r["score"]) for r in results])]
    if parameters:
        raise BadRequest(f"unknown parameters {sorted(parameters)}: this model takes none")
    if isinstance(worker, ClassifierWorker):
        probs = await worker.probabilities(texts, call)  # (n, C)
        labels = [worker.labels[int(j)] for j in probs.argmax(axis=1)]
        n, c = probs.shape
        return [V2Tensor("label", "BYTES", [n], labels),
                V2Tensor("probabilities", "FP32", [n, c], probs.reshape(-1).tolist())]
    if isinstance(worker, TaggerWorker):
        tagged = await worker.tag(texts, call)
        # each element is JSON text itself: the one encoder's (a NaN probability is null)
        data = [encode_json(r["tokens"]).decode() for r in tagged]
        return [V2Tensor("tags", "BYTES", [len(data)], data)]
    raise BadRequest(f"no OIP inference for task {worker.task!r}")
