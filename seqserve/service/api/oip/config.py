"""A ready version's Triton model configuration (`GET /v2/models/{m}/config`, gRPC
ModelConfig), every field what the server does with the model, so that perf_analyzer,
model-analyzer and genai-perf build requests it accepts. One source: the task table
(`export.contract.TASK_SPECS`), the OIP signature (`tasks.signature`), the version's
effective scheduling (`entry.scheduling`, from the same `Settings`) and its worker's runtime.

- `max_batch_size`: the batcher's; `input` / `output` dims without the batch dimension (-1:
  any length). A tensor of one value per request row ([n]: texts, `lengths`, labels, scores)
  is Triton's batched scalar: dims [1] with `reshape: {shape: []}`; infer takes it [n] or
  [n, 1], and answers it [n] (the reshaped shape);
- `sequence_batching` for a model that serves sessions (a stateful feature-sequence bundle
  where sessions are not refused): the control inputs START, END, READY and CORRID as Triton
  names them (a Triton client sends them as the request parameters `sequence_start`,
  `sequence_end` and `sequence_id`, which is what the server reads) and
  `max_sequence_idle_microseconds` the session idle timeout (`--session-idle-timeout-s`);
- `dynamic_batching` for every other model: a batcher's model prefers batches of
  `--max-batch-size` rows and waits at most `--max-wait-ms` for one; a model decoded step
  by step (translator, language model) admits up to its `max_admit` new requests at each step,
  waiting for none (Triton's configuration has one scheduler: sequence or dynamic);
- `model_transaction_policy: {decoupled: true}` for a task that streams (`streams`: a language
  model's ModelStreamInfer answers one response per piece, then a final one);
- `instance_group`: the runtime instances serving it (one for a task with one shared
  instance) and their kind, KIND_GPU when the first ONNX Runtime provider (or the device) is
  an accelerator's, else KIND_CPU.

`seqserve` holds the manifest as served (`Manifest.served_dict`: no build-machine paths) and
the effective scheduling.
"""

from __future__ import annotations

from typing import Any

from seqserve.service.api.oip import tasks
from seqserve.service.repository.entries import ModelEntry
from seqserve.service.workers.series import SeriesWorker

TRITON_TYPES = {"BYTES": "TYPE_STRING", "FP32": "TYPE_FP32", "INT64": "TYPE_INT64",
                "BOOL": "TYPE_BOOL", "INT32": "TYPE_INT32"}
CONTROLS = (("START", "CONTROL_SEQUENCE_START"), ("END", "CONTROL_SEQUENCE_END"),
            ("READY", "CONTROL_SEQUENCE_READY"))
"""Triton's sequence flags as control inputs (false, true as INT32 0, 1); CORRID is the id."""
CPU_PROVIDERS = ("CPUExecutionProvider", "cpu")


def _tensors(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in items:
        dims = t["shape"][1:]
        tensor = {"name": t["name"], "data_type": TRITON_TYPES.get(t["datatype"], t["datatype"]),
                  "dims": dims or [1]}
        if not dims:
            tensor["reshape"] = {"shape": []}
        out.append(tensor)
    return out


def serves_sessions(entry: ModelEntry) -> bool:
    """Whether the version serves sessions: a stateful feature-sequence bundle whose
    sessions this server does not refuse (the replicated layout with several processes)."""
    worker = entry.worker
    return (isinstance(worker, SeriesWorker) and worker.stateful
            and worker.ctx.sessions_refused is None)


def _sequence_batching(scheduling: dict[str, Any]) -> dict[str, Any]:
    idle_s = float(scheduling["sessions"]["idle_timeout_s"])
    controls = [{"name": name, "control": [{"kind": kind, "int32_false_true": [0, 1]}]}
                for name, kind in CONTROLS]
    controls.append({"name": "CORRID", "control": [{"kind": "CONTROL_SEQUENCE_CORRID",
                                                    "data_type": "TYPE_UINT64"}]})
    return {"max_sequence_idle_microseconds": int(idle_s * 1e6), "control_input": controls}


def _dynamic_batching(shared_instance: bool, scheduling: dict[str, Any]) -> dict[str, Any]:
    if shared_instance:
        return {"preferred_batch_size": [int(scheduling["decode"]["max_admit"])],
                "max_queue_delay_microseconds": 0}
    batcher = scheduling["batcher"]
    return {"preferred_batch_size": [int(batcher["max_batch_size"])],
            "max_queue_delay_microseconds": int(float(batcher["max_wait_s"]) * 1e6)}


def _instance_group(shared_instance: bool, described: dict[str, Any]) -> list[dict[str, Any]]:
    providers = list(described.get("providers") or [described.get("device") or "cpu"])
    kind = "KIND_CPU" if str(providers[0]) in CPU_PROVIDERS else "KIND_GPU"
    count = 1 if shared_instance else int(described.get("instances") or 1)
    return [{"name": "seqserve", "kind": kind, "count": count}]


def model_config(entry: ModelEntry) -> dict[str, Any]:
    """A ready version's configuration in Triton's shape (module doc)."""
    manifest, worker = entry.manifest, entry.worker
    assert manifest is not None and worker is not None
    spec = manifest.spec  # the task table's row (export.contract.TASK_SPECS)
    inputs, outputs = tasks.signature(worker)
    scheduling = entry.scheduling or {}
    described = worker.describe()
    runtime = described.get("runtime", "")
    config: dict[str, Any] = {
        "name": entry.name, "version": str(entry.version),
        "platform": f"seqserve_{manifest.task}",
        "backend": "onnxruntime" if runtime == "onnx" else runtime,
        "max_batch_size": int((scheduling.get("batcher") or {}).get("max_batch_size", 0)),
        "input": _tensors(inputs), "output": _tensors(outputs)}
    if serves_sessions(entry):
        config["sequence_batching"] = _sequence_batching(scheduling)
    else:
        config["dynamic_batching"] = _dynamic_batching(spec.shared_instance, scheduling)
    if spec.streams:
        config["model_transaction_policy"] = {"decoupled": True}
    config["instance_group"] = _instance_group(spec.shared_instance, described)
    config["seqserve"] = {"manifest": manifest.served_dict(), "scheduling": scheduling}
    return config
