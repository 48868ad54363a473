"""The protocol fronts: routes and their schemas. Each inference route is declared once, as a
`lifecycle.Route` beside its schemas (its task's worker kind, its request model, its docs),
and answered through the one request lifecycle (`lifecycle`: lookup, deadline, shedding,
in-flight accounting, disconnects, for plain and streamed answers); errors are raised as
`seqserve.service.core.errors` exceptions and mapped to the one error answer by the front.

Modules: `routes` (every route in order: the inference table and FastAPI's routers),
`hot_path` (the HTTP front of the table), `lifecycle`, `common` (shared schema pieces and the
formatter of validation errors), `health`, `models` (listing), `classify`, `translate`,
`tag`, `predict`, `kserve` (KServe V1 predict over those four), `generate` (v1 generate and
score, server-sent events), `openai` (completions), `oip/` (Open Inference Protocol v2:
routes, tensor codec, schemas, per-task adapters, the generate extension), `admin` (the
effective settings of both processes).
"""
