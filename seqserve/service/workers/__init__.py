"""The workers layer: one worker per task, texts (or feature series) in and plain data out.

Workers import `scheduling` (their models' `submit`) and the torch-free contract modules of
`models` and `export`; never FastAPI or pydantic. `WORKERS` is the task table's worker column
(export.contract.TASK_SPECS): a text task's worker is built from a `WorkerContext`, a
feature-sequence task's from a `series.SeriesContext`.
"""

from __future__ import annotations

from typing import Any

from seqserve.service.workers.base import ModelWorker, RequestContext, TextLimits, WorkerContext
from seqserve.service.workers.classifier import ClassifierWorker
from seqserve.service.workers.lm import LMWorker
from seqserve.service.workers.series import SequenceClassifierWorker, SequenceTaggerWorker
from seqserve.service.workers.tagger import TaggerWorker
from seqserve.service.workers.translator import TranslatorWorker

WORKERS: dict[str, Any] = {cls.task: cls for cls in (
    ClassifierWorker, TaggerWorker, TranslatorWorker, LMWorker, SequenceClassifierWorker,
    SequenceTaggerWorker)}
"""The worker class of each task (its `task` names it)."""

__all__ = ["WORKERS", "RequestContext", "ModelWorker", "TextLimits", "TranslatorWorker",
           "WorkerContext"]
