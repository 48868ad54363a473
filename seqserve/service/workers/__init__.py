"""The workers layer: one worker per task family, texts in and plain data out.

Workers import `scheduling` (their models' `submit`) and the torch-free contract modules of
`models` and `export`; never FastAPI or pydantic. `ROW_WORKERS` maps the tasks served by a
batcher to their worker class; translators have `TranslatorWorker` over a decode scheduler.
"""

from __future__ import annotations

from seqserve.service.workers.base import ModelWorker, RequestContext, TextLimits, WorkerContext
from seqserve.service.workers.classifier import ClassifierWorker
from seqserve.service.workers.tagger import TaggerWorker
from seqserve.service.workers.translator import TranslatorWorker

ROW_WORKERS: dict[str, type[ClassifierWorker] | type[TaggerWorker]] = {
    "classifier": ClassifierWorker,
    "tagger": TaggerWorker,
}

__all__ = ["ROW_WORKERS", "RequestContext", "ModelWorker", "TextLimits", "TranslatorWorker",
           "WorkerContext"]
