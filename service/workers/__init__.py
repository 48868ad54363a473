"""Worker registry: task name -> "module:Class" of its ModelWorker.

Imported by path so that a task whose module is not installed fails only the bundles of that
task (reported as failed with the reason) instead of the whole server.
"""

from __future__ import annotations

import importlib

from service.workers.base import Call, ModelWorker, V2Tensor, WorkerContext

WORKERS: dict[str, str] = {
    "classifier": "service.workers.classifier:ClassifierWorker",
    "translator": "service.engine.worker:TranslatorWorker",
    "tagger": "service.workers.tagger:TaggerWorker",
}


def worker_class(task: str) -> type[ModelWorker]:
    """The worker class registered for `task`; raises LookupError saying why not."""
    target = WORKERS.get(task)
    if target is None:
        raise LookupError(f"no worker is registered for task {task!r}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise LookupError(f"worker module {module_name} for task {task!r} is missing") from exc
    cls: type[ModelWorker] = getattr(module, attr)
    return cls


__all__ = ["WORKERS", "Call", "ModelWorker", "V2Tensor", "WorkerContext", "worker_class"]
