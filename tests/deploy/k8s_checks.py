"""Schema validation of rendered manifests and the facts the tests read off them."""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from deploy_support import by_kind, one

KSERVE_CRDS = Path(__file__).resolve().parent / "kserve_crds"

# Kubernetes versions every rendered manifest is validated against (kubernetes-validate's
# bundled OpenAPI schemas, --strict): the oldest still in common managed offerings and the
# newest the package knows.
K8S_VERSIONS = ("1.30.0", "1.33.0", "1.37.0")


@cache
def servicemonitor_schema() -> dict[str, Any]:
    """ServiceMonitor's JSON schema from the prometheus-operator CRD models (cloudcoil), made
    strict like kubernetes-validate --strict: no property the CRD does not declare."""
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    schema = ServiceMonitor.model_json_schema(by_alias=True)

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


def structural_strict(node: Any) -> Any:
    """A CRD's structural schema as the API server applies it with strict field validation
    (`kubectl apply`'s default since 1.27): an object that declares properties takes no other
    field unless marked x-kubernetes-preserve-unknown-fields."""
    if isinstance(node, dict):
        node = {k: structural_strict(v) for k, v in node.items()}
        if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            node.setdefault("additionalProperties", False)
        return node
    if isinstance(node, list):
        return [structural_strict(v) for v in node]
    return node


@cache
def kserve_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict schema, from the KServe CRDs vendored in kserve_crds/."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(KSERVE_CRDS.glob("*.schema.json")):
        schema = json.loads(path.read_text())
        source = schema.pop("x-seqserve-source")
        out[(source["apiVersion"], source["kind"])] = structural_strict(schema)
    return out


DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
OBJECT_META = {"type": "object", "required": ["name"],
               "properties": {"name": {"type": "string", "pattern": DNS_LABEL, "maxLength": 63},
                              "namespace": {"type": "string", "pattern": DNS_LABEL},
                              "labels": {"type": "object",
                                         "additionalProperties": {"type": "string"}},
                              "annotations": {"type": "object",
                                              "additionalProperties": {"type": "string"}}},
               "additionalProperties": False}


def validate(doc: dict[str, Any], version: str) -> None:
    """Raise if `doc` does not validate strictly (built-in kinds) or against its CRD schema."""
    if doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] == "ServiceMonitor":
        jsonschema.validate(doc, servicemonitor_schema())
        return
    if doc["apiVersion"].startswith("serving.kserve.io/"):
        key = (doc["apiVersion"], doc["kind"])
        assert key in kserve_schemas(), f"no vendored KServe schema for {key}"
        jsonschema.validate(doc, kserve_schemas()[key])
        jsonschema.validate(doc["metadata"], OBJECT_META)  # what the CRD leaves to the server
        return
    kubernetes_validate.validate(copy.deepcopy(doc), version, strict=True)


def route_checker() -> Callable[[str, str], bool]:
    """`exists(path, method="GET")`: whether the real app routes it: the inference routes
    (POST) by the route table's own matching (`api/hot_path.py`, what the app dispatches
    them by), every other route by FastAPI's router."""
    from starlette.routing import Match

    from seqserve.service.api import routes
    from seqserve.service.api.hot_path import HotPath
    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    app = create_app(Settings(repo=Path("unused")))
    table = HotPath(app.state.seqserve, routes.TABLE, app.router)

    def exists(path: str, method: str = "GET") -> bool:
        if method == "POST" and table.match(path) is not None:
            return True
        scope = {"type": "http", "path": path, "method": method, "root_path": "",
                 "path_params": {}, "headers": [], "query_string": b""}
        return any(route.matches(scope)[0] == Match.FULL for route in app.routes)

    assert not exists("/no/such/route")
    return exists


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment(docs)["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(docs)["containers"]
    assert len(containers) == 1, "one seqserve container per pod"
    found: dict[str, Any] = containers[0]
    return found


def config_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The ConfigMap the container takes its environment from (envFrom)."""
    names = [e["configMapRef"]["name"] for e in container(docs).get("envFrom", [])
             if "configMapRef" in e]
    maps = {m["metadata"]["name"]: m for m in by_kind(docs, "ConfigMap")}
    assert names and all(n in maps for n in names), f"envFrom names {names}, maps {list(maps)}"
    env: dict[str, str] = {}
    for name in names:
        env.update(maps[name]["data"])
    return env


@contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """`os.environ` with every SEQSERVE_* variable replaced by `values` for the block."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SEQSERVE_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(values)
    try:
        yield
    finally:
        for k in values:
            os.environ.pop(k, None)
        os.environ.update(saved)


def parse_container_cli(docs: list[dict[str, Any]]) -> argparse.Namespace:
    """The container's command + args through the real `seqserve` parser."""
    from seqserve.cli import build_parser

    c = container(docs)
    command = c.get("command", [])
    assert command[:1] == ["seqserve"], f"container command {command} is not seqserve"
    return build_parser().parse_args([*command[1:], *c.get("args", [])])


def effective_settings(docs: list[dict[str, Any]]) -> Any:
    """Settings as the pod's server computes them: ConfigMap env, CLI flags on top."""
    from seqserve.cli.serve import settings_from_args

    args = parse_container_cli(docs)
    assert args.command == "serve"
    with environ(config_env(docs)):
        return settings_from_args(args)


def named_port(docs: list[dict[str, Any]], port: int | str) -> int:
    """A container port by number or by name."""
    ports = container(docs)["ports"]
    if isinstance(port, int):
        assert any(p["containerPort"] == port for p in ports), f"no containerPort {port}"
        return port
    matches = [p["containerPort"] for p in ports if p.get("name") == port]
    assert matches, f"no container port named {port!r}"
    return int(matches[0])


def probes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    c = container(docs)
    return {k: c[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}


def pre_stop_sleep_s(docs: list[dict[str, Any]]) -> float:
    """Seconds the preStop hook sleeps (exec `sleep N` or the native sleep action; 0: none)."""
    hook = container(docs).get("lifecycle", {}).get("preStop")
    if hook is None:
        return 0.0
    if "sleep" in hook:
        return float(hook["sleep"]["seconds"])
    command = hook["exec"]["command"]
    assert command[0] == "sleep", f"preStop is not a sleep: {command}"
    return float(command[1])


def subset(small: dict[str, str], big: dict[str, str]) -> bool:
    return all(big.get(k) == v for k, v in small.items())
