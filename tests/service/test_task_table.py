"""The task table (export.contract.TASK_SPECS) is the one source of task kinds: every layer's
dispatch is a lookup in it, and each layer's column covers exactly its rows."""

from __future__ import annotations

import pytest

from seqserve.export.contract import (
    FAMILIES,
    FEATURE_TASKS,
    GRAPHS_BY_TASK,
    TASK_SPECS,
    TASKS,
    task_spec,
)
from seqserve.service.api.kserve import INSTEAD, V1_FACES
from seqserve.service.api.oip.tasks import FACES
from seqserve.service.api.routes import TABLE
from seqserve.service.engine.interface import HANDLES
from seqserve.service.scheduling.models import BUILDERS, ROW_TASKS
from seqserve.service.workers import WORKERS


def test_every_layer_covers_the_table() -> None:
    assert set(BUILDERS) == set(FAMILIES)
    assert set(HANDLES) == set(FAMILIES)
    assert set(WORKERS) == set(TASKS)
    assert set(FACES) == set(TASKS)
    # KServe V1: a face per task, or what to use instead (a language model)
    assert set(V1_FACES) | set(INSTEAD) == set(TASKS) and not set(V1_FACES) & set(INSTEAD)
    assert set(ROW_TASKS) == {t for t, s in TASK_SPECS.items() if s.family == "rows"}
    assert {s.family for s in TASK_SPECS.values()} == set(FAMILIES)


def test_derived_constants_and_lookups() -> None:
    assert FEATURE_TASKS == ("sequence-classifier", "sequence-tagger")
    assert GRAPHS_BY_TASK["translator"] == ("encoder", "decoder_step")
    for task, cls in WORKERS.items():
        assert cls.task == task
    assert task_spec("lm").streams and task_spec("lm").shared_instance
    assert not task_spec("classifier").shared_instance
    with pytest.raises(LookupError, match="not one of"):
        task_spec("regressor")


def test_every_worker_kind_of_a_route_is_in_the_table() -> None:
    kinds = {r.kind for r in TABLE if r.kind is not None}
    tasks = {getattr(k, "task", None) for k in kinds}
    # a route's kind is a worker of the table (SeriesWorker: either feature-sequence task)
    assert tasks - {None} <= set(TASKS)
