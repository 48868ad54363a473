"""deploy/kserve: the seqserve ServingRuntime and the example InferenceService.

Rendered by kustomize (what `kubectl apply -k deploy/kserve` sends), validated against KServe's
own CRD schemas (vendored in kserve_crds/, version in its README) with strict field checking,
and cross-checked against the server they run: the container's command through the real
`seqserve` parser, its env through `Settings`, probes and the metrics path against the app's
routes, the v2 protocol it declares against the routes KServe calls, the image against the
Dockerfile and the cpu overlay.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest
from deploy_support import DEPLOY, REPO, by_kind, one, render
from dockerfile_sim import exec_form, parse_dockerfile
from k8s_checks import K8S_VERSIONS, KSERVE_CRDS, environ, route_checker, validate

Docs = list[dict[str, Any]]
# Where KServe puts the storageUri's files (its constants.DefaultModelLocalMountPath).
KSERVE_MODEL_MOUNT = "/mnt/models"


@pytest.fixture(scope="module")
def kserve() -> Docs:
    return render(DEPLOY / "kserve")


def runtime(docs: Docs) -> dict[str, Any]:
    return one(docs, "ServingRuntime")


def isvc(docs: Docs) -> dict[str, Any]:
    return one(docs, "InferenceService")


def server_container(docs: Docs) -> dict[str, Any]:
    containers = runtime(docs)["spec"]["containers"]
    assert [c["name"] for c in containers] == ["kserve-container"], \
        "KServe serves the model from the container named kserve-container"
    found: dict[str, Any] = containers[0]
    return found


def runtime_settings(docs: Docs) -> Any:
    """Settings as the runtime's server computes them: its env, then its flags."""
    from seqserve.cli import build_parser
    from seqserve.cli.serve import settings_from_args

    c = server_container(docs)
    assert c["command"][:1] == ["seqserve"]
    args = build_parser().parse_args([*c["command"][1:], *c.get("args", [])])
    assert args.command == "serve"
    env = {e["name"]: e["value"] for e in c.get("env", [])}
    with environ(env):
        return settings_from_args(args)


def test_renders_the_runtime_and_the_service(kserve: Docs) -> None:
    assert sorted(d["kind"] for d in kserve) == ["InferenceService", "ServingRuntime"]
    assert {d["metadata"]["namespace"] for d in kserve} == {"seqserve"}


def test_vendored_schemas_name_their_source() -> None:
    source = json.loads((KSERVE_CRDS / "source.json").read_text())
    readme = (KSERVE_CRDS / "README.md").read_text()
    assert source["ref"] in readme and source["commit"] in readme
    assert {f["schema"] for f in source["files"].values()} == \
        {p.name for p in KSERVE_CRDS.glob("*.schema.json")}


def test_validates_against_kserve_crds(kserve: Docs) -> None:
    for doc in kserve:
        validate(doc, K8S_VERSIONS[0])


@pytest.mark.parametrize("break_it", [
    lambda d: d["spec"]["containers"][0].__setitem__("readinesProbe", {}),  # misspelt
    lambda d: d["spec"].__setitem__("protocolVersions", "v2"),  # not a list
    lambda d: d["spec"]["supportedModelFormats"][0].pop("name"),  # required
    lambda d: d["metadata"].__setitem__("name", "Seq_Serve"),  # not a DNS label
])
def test_runtime_schema_is_live(kserve: Docs, break_it: Any) -> None:
    doc = copy.deepcopy(runtime(kserve))
    break_it(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, K8S_VERSIONS[0])


@pytest.mark.parametrize("break_it", [
    lambda d: d["spec"]["predictor"]["model"].__setitem__("storageURI", "pvc://x"),  # misspelt
    lambda d: d["spec"]["predictor"].__setitem__("minReplicas", "one"),  # not an integer
    lambda d: d["spec"].pop("predictor"),  # required
    lambda d: d["spec"].__setitem__("transformer", {"containers": []}),  # not vendored
])
def test_inferenceservice_schema_is_live(kserve: Docs, break_it: Any) -> None:
    doc = copy.deepcopy(isvc(kserve))
    break_it(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc, K8S_VERSIONS[0])


def test_runtime_runs_the_server_on_kserves_model_mount(kserve: Docs) -> None:
    from seqserve.service.web.settings import Settings

    c = server_container(kserve)
    unknown = [e["name"] for e in c.get("env", []) if not e["name"].startswith("SEQSERVE_")
               or e["name"].removeprefix("SEQSERVE_").lower() not in Settings.model_fields]
    assert not unknown, f"env that is no Settings field: {unknown}"
    settings = runtime_settings(kserve)  # validates every value, as the server would
    assert str(settings.repo) == KSERVE_MODEL_MOUNT
    assert settings.host == "0.0.0.0"
    # HTTP first (KServe routes HTTP there), then gRPC as h2c
    assert [p["containerPort"] for p in c["ports"]] == [settings.port, settings.grpc_port]
    assert settings.grpc and c["ports"][1]["name"] == "h2c"
    assert settings.warmup is True  # readiness waits for the warm-up


def test_probes_and_metrics_hit_real_routes_on_the_served_port(kserve: Docs) -> None:
    exists = route_checker()
    settings = runtime_settings(kserve)
    c = server_container(kserve)
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in (c["readinessProbe"], c["livenessProbe"]):
        assert exists(probe["httpGet"]["path"])
        assert probe["httpGet"]["port"] == settings.port
    assert "startupProbe" not in c, "Knative (KServe's Knative mode) rejects startupProbe"
    annotations = runtime(kserve)["spec"]["annotations"]
    assert int(annotations["prometheus.kserve.io/port"]) == settings.port
    assert exists(annotations["prometheus.kserve.io/path"])
    assert not settings.auth_health and not settings.auth_metrics  # probes carry no key


def test_declared_protocol_is_served(kserve: Docs) -> None:
    """protocolVersions v2: the Open Inference Protocol's REST routes exist in the app;
    grpc-v2: its gRPC service (KServe's grpc_predict_v2 RPCs) is declared by the gRPC front."""
    from seqserve.service.api.grpc import messages

    assert runtime(kserve)["spec"]["protocolVersions"] == ["v2", "grpc-v2"]
    exists = route_checker()
    for path, method in (("/v2", "GET"), ("/v2/health/live", "GET"), ("/v2/health/ready", "GET"),
                         ("/v2/models/m", "GET"), ("/v2/models/m/ready", "GET"),
                         ("/v2/models/m/infer", "POST"), ("/v2/models/m/versions/1/infer",
                                                          "POST")):
        assert exists(path, method), f"{method} {path}"
    assert {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
            "ModelInfer"} <= set(messages.method_types(messages.INFERENCE))


def test_runtime_runs_the_cpu_image_as_its_user(kserve: Docs) -> None:
    stage = parse_dockerfile((REPO / "Dockerfile").read_text()).stage("cpu")
    entry, user = stage.last("ENTRYPOINT"), stage.last("USER")
    assert entry and user
    c = server_container(kserve)
    assert c["command"] == exec_form(entry.args)
    # The image the cpu overlay deploys (the one deploy/build-image.sh builds and checks).
    overlay = one(render(DEPLOY / "overlays" / "cpu"), "Deployment")
    assert c["image"] == overlay["spec"]["template"]["spec"]["containers"][0]["image"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and str(sc["runAsUser"]) == user.args.split(":")[0]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    # A read-only root needs a writable /tmp: an emptyDir of the runtime.
    volumes = {v["name"]: v for v in runtime(kserve)["spec"]["volumes"]}
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]]


def test_inferenceservice_uses_the_runtime(kserve: Docs) -> None:
    rt, svc = runtime(kserve), isvc(kserve)
    model = svc["spec"]["predictor"]["model"]
    assert model["runtime"] == rt["metadata"]["name"]
    assert rt["metadata"]["namespace"] == svc["metadata"]["namespace"]  # a namespaced runtime
    formats = {(f["name"], f.get("version")) for f in rt["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
    assert model["protocolVersion"] in rt["spec"]["protocolVersions"]
    # The bundles: the cpu overlay's PVC (a model repository), in the same namespace.
    scheme, _, claim = model["storageUri"].partition("://")
    assert scheme == "pvc"
    pvcs = by_kind(render(DEPLOY / "overlays" / "cpu"), "PersistentVolumeClaim")
    assert any(p["metadata"]["name"] == claim.split("/")[0]
               and p["metadata"]["namespace"] == svc["metadata"]["namespace"] for p in pvcs)
    annotations = svc["metadata"]["annotations"]
    assert annotations["serving.kserve.io/deploymentMode"] in {"Standard", "Knative"}
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"


def test_grace_period_covers_delay_and_drain(kserve: Docs) -> None:
    settings = runtime_settings(kserve)
    grace = isvc(kserve)["spec"]["predictor"]["terminationGracePeriodSeconds"]
    needed = settings.shutdown_delay_s + settings.drain_timeout_s + 5
    assert grace > needed, f"grace {grace} s <= delay + drain + 5 = {needed} s"
