"""The HTTP layer: routes and their schemas. Each route parses and validates a request, calls
one worker method (`seqserve.service.workers`) and shapes its plain-data answer; errors are raised
as
`seqserve.service.core.errors` exceptions and mapped to responses in `seqserve.service.server.app`.

Modules: `common` (shared dependencies, error schema, validation messages), `health`,
`models` (listing), `classify`, `translate`, `tag` (v1 routes with their schemas), `oip/`
(Open Inference Protocol v2: routes, tensor codec, schemas, per-task adapters), `admin`
(the effective settings of both processes).
"""
