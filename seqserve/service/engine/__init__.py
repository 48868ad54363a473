"""The engine layer: the models of one device behind a ZeroMQ socket (docs/architecture.md,
"Processes").

- `options`: `EngineOptions`, the plain configuration an engine is started with.
- `loading`: bundle -> verified manifest, runtime(s), scheduled model (used in and out of
  the engine process).
- `protocol`: the frames between API processes and the engine (msgspec msgpack; token ids
  and result arrays as raw buffers).
- `server`: the engine process's loop: receive, submit to the batchers and decode schedulers,
  reply; drain on SIGTERM.
- `client`: the API-process side: one socket per process, remote models with the same
  `submit` as the in-process ones (`seqserve.service.scheduling.models.RowModel` / `DecodeModel`).

Like `scheduling/` and `runtimes/`, this layer imports no web framework and no pydantic.
"""
