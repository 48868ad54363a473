"""The live OpenAPI document: what this server, with these settings and these models, accepts.

FastAPI builds the document from the routes' schemas: its own routers' and the inference
routes' table (`seqserve.service.api.routes`), each table route as the two FastAPI operations
it always was (default and pinned version), built here for the document only (the hot path
serves them); this adds what only the running server knows, so that the document declares
every constraint the server enforces:

- the live limits: texts per request (`max_texts`; a language model's prompts times
  sequences per prompt) and characters per text (`max_chars`);
- one OIP infer operation per served model and version, with that model's exact body
  (`seqserve.service.api.oip.docs`), instead of the generic `/v2/models/{name}/infer`; the same for
  the v1 routes (`/v1/models/{name}/classify`, `translate`, `tag`): each model's texts must
  hold a character its own tokenizer keeps (the number models drop punctuation);
- each per-model operation's id names its model (and version, on the pinned path:
  `v1_classify_<model>`, `v1_classify_<model>_v<version>`, `v2_infer_<model>...`), unique
  across the document, as code generators need;
- errors as the server writes them (`{"error": message}`, also for 422);
- with API keys, the bearer scheme and the 401 answer on every protected operation.

The document is built when first asked for once the models are loaded, then kept.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from seqserve.service.api import lifecycle
from seqserve.service.api.oip import docs, tasks
from seqserve.service.api.oip.schemas import V2InferResponse
from seqserve.service.core.errors import ServiceError
from seqserve.service.web.auth import AUTHORIZED, is_open
from seqserve.service.web.responses import OPENAI_PATHS, JsonResponse
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import text_pattern
from seqserve.service.workers.series import SeriesWorker

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
INFER_ERRORS = (400, 404, 413, 429, 500, 503, 504)


def install(app: FastAPI, state: AppState,
            fronts: Iterable[APIRouter | lifecycle.Route]) -> None:
    """Serve the live document of `fronts` (FastAPI's routers and the inference routes, in
    order) at /openapi.json (and to /docs)."""
    routes = documented(fronts)
    generic: list[dict[str, Any]] = []

    def build(models: bool) -> dict[str, Any]:
        doc = get_openapi(title=app.title, version=app.version, description=app.description,
                          routes=routes)
        live_document(doc, state, models)
        return doc

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = build(models=True)
        if state.started:  # the models are known: keep it
            app.openapi_schema = doc
        return doc

    def public() -> dict[str, Any]:
        """With API keys on, for a request without a valid key: the routes, limits and
        errors, but no operation of a served model (which models exist is not public)."""
        if not generic:
            generic.append(build(models=False))
        return generic[0]

    app.openapi = openapi  # type: ignore[method-assign]

    async def document(request: Request) -> JsonResponse:
        authorized = not state.settings.keys_on or request.scope.get(AUTHORIZED, False)
        doc = app.openapi() if authorized else public()
        root_path = request.scope.get("root_path", "").rstrip("/")
        if root_path and root_path not in {s.get("url") for s in doc.get("servers", [])}:
            doc = {**doc, "servers": [{"url": root_path}, *doc.get("servers", [])]}
        return JsonResponse(doc)

    # FastAPI's own /openapi.json route encodes with json.dumps; ours with the one encoder
    def builtin(route: BaseRoute) -> bool:
        return isinstance(route, Route) and route.path == app.openapi_url

    app.router.routes[:] = [r for r in app.router.routes if not builtin(r)]
    if app.openapi_url:
        app.add_route(app.openapi_url, document, include_in_schema=False)


def documented(fronts: Iterable[APIRouter | lifecycle.Route]) -> list[BaseRoute]:
    """The routes the document lists: each router's, and each table route's operations."""
    routes: list[BaseRoute] = []
    for front in fronts:
        if isinstance(front, APIRouter):
            routes += front.routes
        elif front.documented:
            routes += [operation(front, pinned) for pinned in
                       ((False, True) if front.by_model else (False,))]
    return routes


def operation(route: lifecycle.Route, pinned: bool) -> APIRoute:
    """A table route as the FastAPI route it documents: its path parameters and body in the
    endpoint's signature, its description the endpoint's docstring."""
    params = [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)
              for p in (("name", "version") if pinned else ("name",)) if route.by_model]
    if route.body is not None:
        params.append(inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        annotation=route.body))

    async def endpoint() -> None:  # never called: the hot path serves the route
        raise NotImplementedError

    endpoint.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    endpoint.__doc__ = route.version_doc if pinned else route.doc
    return APIRoute(route.path(pinned), endpoint, methods=["POST"], name=route.name,
                    response_model=route.response_model, responses=dict(route.responses),
                    tags=list(route.tags or (route.prefix.strip("/"),)),
                    response_class=Response if route.events else JsonResponse)


def live_document(doc: dict[str, Any], state: AppState, models: bool = True) -> None:
    """Add the live limits, the per-model operations (unless not `models`), the error and
    auth answers."""
    s = state.settings
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for schema in schemas.values():
        texts = schema.get("properties", {}).get("texts")
        if texts is not None:
            texts["maxItems"] = s.max_texts
            texts["items"]["maxLength"] = s.max_chars
        for listed in ("series", "instances"):  # a predict body's, KServe V1's
            items = schema.get("properties", {}).get(listed)
            if items is not None:
                items["maxItems"] = s.max_texts
    for name, field in (("GenerateRequest", "max_new_tokens"),
                        ("GenerateParameters", "max_tokens"),
                        ("StreamParameters", "max_tokens"),
                        ("CompletionRequest", "max_tokens"), ("ChatRequest", "max_tokens"),
                        ("ChatRequest", "max_completion_tokens")):  # the LMs' limit
        prop = schemas.get(name, {}).get("properties", {}).get(field)
        if prop is not None:
            prop["maximum"] = min(prop.get("maximum", s.max_new_tokens), s.max_new_tokens)
    for schema in schemas.values():
        one = schema.get("properties", {}).get("text_input")
        if one is not None:
            one["maxLength"] = s.max_chars
    for name, prompts, counts in (("GenerateRequest", "prompts", ("n",)),
                                  ("CompletionRequest", "prompt", ("n", "best_of"))):
        if name in schemas:
            _sequence_limit(schemas[name], prompts, counts, s.max_texts)
    chat = schemas.get("ChatRequest", {}).get("properties", {})
    if "n" in chat:  # one prompt: n sequences at most max_texts
        chat["n"]["maximum"] = min(chat["n"].get("maximum", s.max_texts), s.max_texts)
    _errors_as_served(doc)
    if models:
        if "model" in chat:
            chat["model"]["enum"] = _chat_models(state)
        _v1_operations(doc, state)
        _infer_operations(doc, state)
        _unique_operation_ids(doc)
    if s.keys_on:
        _bearer(doc, s.auth_health, s.auth_metrics)


def _chat_models(state: AppState) -> list[str]:
    """The served models /v1/chat/completions takes: language models whose default version
    is loaded with a chat template (another model: a 400 or 404)."""
    names = []
    for name in sorted(state.repository.entries):
        try:
            entry = state.repository.entry(name)
        except ServiceError:
            continue
        ctx = getattr(entry.worker, "ctx", None)
        manifest = getattr(ctx, "manifest", None)
        if manifest is not None and getattr(manifest, "chat_template", None) is not None:
            names.append(name)
    return names


def _unique_operation_ids(doc: dict[str, Any]) -> None:
    """Two model names that differ only in characters an operation id leaves out ("a-b",
    "a_b") would share an id: the later operation's gets a number."""
    seen: set[str] = set()
    for item in doc["paths"].values():
        for method, op in item.items():
            given = op.get("operationId")
            if given is None:
                continue
            unique, n = given, 1
            while unique in seen:
                n += 1
                unique = f"{given}_{n}"
            if unique != given:
                item[method] = {**op, "operationId": unique}
            seen.add(unique)


def _sequence_limit(schema: dict[str, Any], prompts: str, counts: tuple[str, ...],
                    max_texts: int) -> None:
    """A language model generates at most `max_texts` sequences per request: prompts times
    sequences per prompt (each of `counts`, when given). `prompts` is a list of prompts, or
    one prompt (a string or a list of token ids: one sequence per count)."""
    one = [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]
    rules = []
    for count in counts:
        prop = schema["properties"][count]
        for node in [prop, *prop.get("anyOf", [])]:
            if node.get("type") == "integer":
                node["maximum"] = min(node.get("maximum", max_texts), max_texts)
        rules += [{"if": {"required": [count] if k > 1 else [],  # absent: its default, 1
                          "properties": {count: {"const": k}}},
                   "then": {"properties": {prompts: {"anyOf": [
                       *one, {"type": "null"}, {"maxItems": max_texts // k}]}}}}
                  for k in range(1, max_texts + 1)]
    schema["allOf"] = [*schema.get("allOf", []), *rules]


def _errors_as_served(doc: dict[str, Any]) -> None:
    """Every answer the app's handlers write is {"error": message}: 422 included."""
    schemas = doc["components"]["schemas"]
    for path in doc["paths"].values():
        for op in path.values():
            unprocessable = op.get("responses", {}).get("422")
            if unprocessable is not None:
                unprocessable["content"] = {"application/json": {"schema": ERROR_REF}}
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)


def _infer_operations(doc: dict[str, Any], state: AppState) -> None:
    repo, s = state.repository, state.settings
    response = V2InferResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    doc["components"]["schemas"].update(response.pop("$defs", {}))
    doc["components"]["schemas"]["V2InferResponse"] = response
    errors = {str(code): {"description": "Error", "content": {"application/json": {
        "schema": ERROR_REF}}} for code in INFER_ERRORS}
    for name in sorted(repo.entries):
        default = repo.default_version(name)
        for version, entry in sorted(repo.versions(name).items()):
            if entry.state != "ready" or entry.worker is None:
                continue
            outputs = tasks.output_names(entry.worker)
            pinned = (f"/v2/models/{name}/versions/{version}/infer", version)
            targets = [pinned, (f"/v2/models/{name}/infer", None)] if version == default \
                else [pinned]
            if isinstance(entry.worker, SeriesWorker):
                for path, which in targets:
                    doc["paths"][path] = {"post": docs.series_infer_operation(
                        name, which, entry.task or "", outputs, entry.worker.features,
                        entry.worker.stateful, errors)}
                continue
            text = _text_schema(entry, s.max_chars)
            (given,) = tasks.signature(entry.worker)[0]  # a text model's one input
            for path, which in targets:
                doc["paths"][path] = {"post": docs.infer_operation(
                    name, which, entry.task or "", outputs, s.max_texts, text, given["name"],
                    errors)}


V1_VERBS = {"classifier": "classify", "translator": "translate", "tagger": "tag",
            "sequence-classifier": "predict", "sequence-tagger": "predict"}


def _text_schema(entry: Any, max_chars: int) -> dict[str, Any]:
    """One text as a model accepts it: its tokenizer's own rule (`text_pattern`)."""
    blank = entry.worker.ctx.tokenizer.blank_characters()
    return {"type": "string", "minLength": 1, "maxLength": max_chars,
            "pattern": text_pattern(blank)}


def _v1_operations(doc: dict[str, Any], state: AppState) -> None:
    """Replace the generic v1 inference paths, KServe V1's `:predict` too, by one operation
    per served model (and per version), whose body schema carries that model's text rule
    (or its series' width and length)."""
    paths, schemas = doc["paths"], doc["components"]["schemas"]
    generic = {verb: paths.pop(f"/v1/models/{{name}}/{verb}", None) for verb in
               set(V1_VERBS.values())}
    for verb in set(V1_VERBS.values()):
        paths.pop(f"/v1/models/{{name}}/versions/{{version}}/{verb}", None)
    kserve = paths.pop("/v1/models/{name}:predict", None)
    paths.pop("/v1/models/{name}/versions/{version}:predict", None)
    repo = state.repository
    for name in sorted(repo.entries):
        default = repo.default_version(name)
        for version, entry in sorted(repo.versions(name).items()):
            template = generic.get(V1_VERBS.get(entry.task or "", ""))
            if entry.state != "ready" or entry.worker is None or template is None:
                continue
            if isinstance(entry.worker, SeriesWorker):
                op = _series_operation(template["post"], schemas, entry.worker)
                instance = _series_schema(_body_schema(template["post"], schemas)
                                          ["properties"]["series"]["items"], entry.worker)
            else:
                text = _text_schema(entry, state.settings.max_chars)
                op = _model_operation(template["post"], schemas, text)
                instance = {"anyOf": [text, {"type": "object", "properties": {"text": text},
                                             "required": ["text"],
                                             "additionalProperties": False}]}
            verb = V1_VERBS[entry.task or ""]
            operations = [(f"/{verb}", f"v1_{verb}", op)]
            if kserve is not None:
                operations.append((":predict", "v1_kserve_predict",
                                   _kserve_operation(kserve["post"], schemas, instance)))
            for tail, prefix, one in operations:
                targets: list[tuple[str, int | None]] = [
                    (f"/v1/models/{name}/versions/{version}{tail}", version)]
                if version == default:
                    targets.append((f"/v1/models/{name}{tail}", None))
                for path, which in targets:
                    paths[path] = {"post": {**one, "operationId": docs.operation_id(
                        prefix, name, which)}}


def _body_schema(template: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """A copy of an operation's body schema (its reference resolved)."""
    schema = template["requestBody"]["content"]["application/json"]["schema"]
    ref = schema.get("$ref", "")
    return copy.deepcopy(schemas[ref.rsplit("/", 1)[-1]] if ref else schema)


def _kserve_operation(template: dict[str, Any], schemas: dict[str, Any],
                      instance: dict[str, Any]) -> dict[str, Any]:
    """A model's KServe V1 predict operation: each instance as that model takes one."""
    op = copy.deepcopy(template)
    op.pop("parameters", None)
    body = _body_schema(template, schemas)
    body["properties"]["instances"]["items"] = instance
    op["requestBody"]["content"]["application/json"]["schema"] = body
    return op


def _series_schema(series: dict[str, Any], worker: SeriesWorker) -> dict[str, Any]:
    """One series' schema as a model takes it: at most its step limit long, its steps
    exactly `features` wide."""
    series["maxItems"] = worker.ctx.limits.max_steps
    series["items"]["minItems"] = series["items"]["maxItems"] = worker.features
    return series


def _model_operation(template: dict[str, Any], schemas: dict[str, Any],
                     text: dict[str, Any]) -> dict[str, Any]:
    op = copy.deepcopy(template)
    op.pop("parameters", None)  # no path parameters left
    content = op["requestBody"]["content"]["application/json"]
    ref = content["schema"].get("$ref", "")
    body = copy.deepcopy(schemas[ref.rsplit("/", 1)[-1]]) if ref else content["schema"]
    body["properties"]["texts"]["items"] = text
    content["schema"] = body
    return op


def _series_operation(template: dict[str, Any], schemas: dict[str, Any],
                      worker: SeriesWorker) -> dict[str, Any]:
    """A feature-sequence model's predict operation: its steps exactly `features` wide, its
    series at most its step limit long; a stateful model's session fields (one series with
    a session), none for a model without state."""
    op = copy.deepcopy(template)
    op.pop("parameters", None)
    content = op["requestBody"]["content"]["application/json"]
    ref = content["schema"].get("$ref", "")
    body = copy.deepcopy(schemas[ref.rsplit("/", 1)[-1]]) if ref else content["schema"]
    _series_schema(body["properties"]["series"]["items"], worker)
    if worker.stateful:  # a session's chunk is one series; start and end need a session
        body["anyOf"] = [
            {"properties": {"session": {"type": "null"}, "start": {"const": False},
                            "end": {"const": False}}},
            {"required": ["session"], "properties": {"session": {"type": "string"},
                                                     "series": {"maxItems": 1}}}]
    else:  # a bundle without state serves no sessions
        for key in ("session", "start", "end"):
            body["properties"].pop(key, None)
    content["schema"] = body
    return op


def _bearer(doc: dict[str, Any], auth_health: bool, auth_metrics: bool) -> None:
    doc["components"]["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "An API key of the server (`--api-key`)."}}
    unauthorized = {"description": "No valid API key", "content": {"application/json": {
        "schema": ERROR_REF}}}
    for path, item in doc["paths"].items():
        if is_open(path, auth_health, auth_metrics):
            continue
        for op in item.values():
            op["security"] = [{"bearer": []}]
            responses = op.setdefault("responses", {})
            if path in OPENAI_PATHS:  # refused in OpenAI's shape, like its other errors
                responses["401"] = {"description": "No valid API key",
                                    "content": copy.deepcopy(responses["400"]["content"])}
            else:
                responses["401"] = unauthorized
