"""The kustomize overlays: schema-valid, and consistent with the server they run.

Every check runs on the rendered overlays (what `kubectl apply -k` sends), not on the base
files; the cross-checks ask the real code (routes of `create_app`, the `seqserve` argument
parser, `Settings`) rather than restating it.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from deploy_support import REPO, adapter_rules, by_kind, one
from dockerfile_sim import exec_form, parse_dockerfile
from k8s_checks import (
    K8S_VERSIONS,
    config_env,
    container,
    deployment,
    effective_settings,
    environ,
    named_port,
    parse_container_cli,
    pod_spec,
    pre_stop_sleep_s,
    probes,
    route_checker,
    subset,
    validate,
)

Docs = dict[str, list[dict[str, Any]]]
OVERLAYS = ["cpu", "gpu"]
EXPECTED_KINDS = {"ServiceAccount", "ConfigMap", "Service", "PersistentVolumeClaim",
                  "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                  "NetworkPolicy", "ServiceMonitor"}


@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_renders_every_kind(rendered: Docs, overlay: str) -> None:
    assert {d["kind"] for d in rendered[overlay]} == EXPECTED_KINDS


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", [*OVERLAYS, "base"])
def test_validates_strictly(rendered: Docs, overlay: str, version: str) -> None:
    for doc in rendered[overlay]:
        validate(doc, version)


def test_strict_validation_catches_unknown_fields(rendered: Docs) -> None:
    """The validators are live: a misspelt field in a Deployment or ServiceMonitor fails."""
    deploy = copy.deepcopy(deployment(rendered["cpu"]))
    deploy["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deploy, K8S_VERSIONS[0])
    monitor = copy.deepcopy(one(rendered["cpu"], "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor, K8S_VERSIONS[0])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_security_context(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    pod, c = pod_spec(docs), container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"]
    # A read-only root needs a writable /tmp: an emptyDir.
    volumes = {v["name"]: v for v in pod["volumes"]}
    tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert tmp and "emptyDir" in volumes[tmp[0]["name"]]
    # The image's USER is the uid the pod runs as.
    df = parse_dockerfile((REPO / "Dockerfile").read_text())
    user = df.stage(overlay).last("USER")
    assert user is not None
    assert user.args.split(":")[0] == str(pod["securityContext"]["runAsUser"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_hit_real_routes_on_the_served_port(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    route_exists = route_checker()
    settings = effective_settings(docs)
    p = probes(docs)
    assert p["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert p["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # The startup probe asks readiness, which turns true only after load and warm-up.
    assert p["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert settings.warmup is True
    for probe in p.values():
        assert route_exists(probe["httpGet"]["path"])
        assert named_port(docs, probe["httpGet"]["port"]) == settings.port
    assert settings.host == "0.0.0.0"  # the kubelet probes the pod IP
    served = {"http": settings.port, "grpc": settings.grpc_port}  # HTTP, and gRPC
    assert settings.grpc and {n: named_port(docs, n) for n in served} == served
    service = one(docs, "Service")
    assert {p["name"]: named_port(docs, p["targetPort"]) for p in service["spec"]["ports"]} \
        == served
    monitor = one(docs, "ServiceMonitor")
    service_ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in service_ports and route_exists(endpoint["path"])
    for rule in one(docs, "NetworkPolicy")["spec"]["ingress"]:
        assert sorted(named_port(docs, port["port"]) for port in rule["ports"]) == \
            sorted(served.values())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_args_parse_and_configmap_names_settings(rendered: Docs, overlay: str) -> None:
    from seqserve.service.web.settings import Settings

    docs = rendered[overlay]
    args = parse_container_cli(docs)
    assert args.command == "serve"
    fields = set(Settings.model_fields)
    env = config_env(docs)
    unknown = [k for k in env if not k.startswith("SEQSERVE_")
               or k.removeprefix("SEQSERVE_").lower() not in fields]
    assert not unknown, f"ConfigMap keys that are no Settings field: {unknown}"
    settings = effective_settings(docs)  # validates every value, as the server would
    # The ConfigMap reaches the server: every value not overridden by a flag is in effect.
    as_fields = {k.removeprefix("SEQSERVE_").lower(): v for k, v in env.items()}
    with environ({}):
        expected = Settings.model_validate(as_fields)
    for field in as_fields:
        if getattr(args, field, None) is None:
            assert getattr(settings, field) == getattr(expected, field), field
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert str(settings.repo) == mounts["models"]["mountPath"]
    assert mounts["models"]["readOnly"] is True
    assert settings.device == ("cuda" if overlay == "gpu" else "cpu")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_grace_period_covers_prestop_and_drain(rendered: Docs, overlay: str) -> None:
    """SIGTERM comes after any preStop; the server then stays up not ready for
    shutdown_delay_s (the endpoint removal's propagation), then spends one drain budget
    (drain_timeout_s) plus a margin of 5 s for the processes to exit."""
    docs = rendered[overlay]
    settings = effective_settings(docs)
    grace = pod_spec(docs)["terminationGracePeriodSeconds"]
    needed = pre_stop_sleep_s(docs) + settings.shutdown_delay_s + settings.drain_timeout_s + 5
    assert grace > needed, f"grace {grace} s <= preStop + delay + drain + 5 = {needed} s"
    assert pre_stop_sleep_s(docs) + settings.shutdown_delay_s >= 5  # propagation covered


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rollout_and_startup_budget(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    strategy = deployment(docs)["spec"]["strategy"]["rollingUpdate"]
    assert strategy["maxUnavailable"] == 0 and strategy["maxSurge"] >= 1
    startup = probes(docs)["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
    resources = container(docs)["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]


def test_gpu_overlay_schedules_on_gpus_and_cpu_does_not(rendered: Docs) -> None:
    gpu, cpu = rendered["gpu"], rendered["cpu"]
    res = container(gpu)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "1"
    spec = pod_spec(gpu)
    assert any(t["key"] == "nvidia.com/gpu" and t["effect"] == "NoSchedule"
               for t in spec["tolerations"])
    assert any(k.startswith("nvidia.com/gpu") for k in spec["nodeSelector"])
    assert container(gpu)["image"].endswith("-gpu") and container(cpu)["image"].endswith("-cpu")
    assert "nvidia.com" not in str(pod_spec(cpu))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_selectors_match_own_pods_only(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    other = rendered["gpu" if overlay == "cpu" else "cpu"]
    pod_labels = deployment(docs)["spec"]["template"]["metadata"]["labels"]
    other_pod_labels = deployment(other)["spec"]["template"]["metadata"]["labels"]
    selectors = [
        deployment(docs)["spec"]["selector"]["matchLabels"],
        one(docs, "Service")["spec"]["selector"],
        one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
        one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
    ]
    for sel in selectors:
        assert subset(sel, pod_labels), f"{sel} does not select {pod_labels}"
        assert not subset(sel, other_pod_labels), f"{sel} also selects the other overlay"
    monitor = one(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert subset(monitor, one(docs, "Service")["metadata"]["labels"])
    assert not subset(monitor, one(other, "Service")["metadata"]["labels"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hpa_scales_on_adapter_metric_with_cpu_fallback(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    hpa = one(docs, "HorizontalPodAutoscaler")["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment",
                                                deployment(docs)["metadata"]["name"])
    served = {r["name"]["as"] for r in adapter_rules()}
    pods = [m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"]
    assert pods and set(pods) <= served, f"HPA Pods metrics {pods}, adapter serves {served}"
    cpu = [m for m in hpa["metrics"] if m["type"] == "Resource"]
    assert cpu and cpu[0]["resource"]["name"] == "cpu"
    assert "cpu" in container(docs)["resources"]["requests"]  # Utilization needs a request
    assert 1 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    pdb = one(docs, "PodDisruptionBudget")["spec"]
    # A PDB that a single replica cannot satisfy would block every node drain.
    assert pdb.get("maxUnavailable", 0) >= 1 or pdb["minAvailable"] < hpa["minReplicas"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_agrees_with_the_image(rendered: Docs, overlay: str) -> None:
    docs = rendered[overlay]
    stage = parse_dockerfile((REPO / "Dockerfile").read_text()).stage(overlay)
    entry, cmd, expose, volume = (stage.last(k) for k in ("ENTRYPOINT", "CMD", "EXPOSE",
                                                          "VOLUME"))
    assert entry and cmd and expose and volume
    c = container(docs)
    assert c["command"] == exec_form(entry.args)
    assert c["args"] == exec_form(cmd.args)
    exposed = [int(p.split("/")[0]) for p in expose.args.split()]
    assert [named_port(docs, "http"), named_port(docs, "grpc")] == exposed
    mounts = [m["mountPath"] for m in c["volumeMounts"]]
    assert all(v in mounts for v in exec_form(volume.args))


def test_no_namespace_collision_between_overlays(rendered: Docs) -> None:
    names = {o: {(d["kind"], d["metadata"]["name"]) for d in rendered[o]} for o in OVERLAYS}
    assert not names["cpu"] & names["gpu"]
    assert by_kind(rendered["cpu"], "Deployment")[0]["metadata"]["namespace"] == \
        by_kind(rendered["gpu"], "Deployment")[0]["metadata"]["namespace"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_api_keys_come_from_an_optional_secret(rendered: Docs, overlay: str) -> None:
    """SEQSERVE_API_KEY is read from a Secret that may be absent (then keys are off), never
    from the ConfigMap; probes and the ServiceMonitor carry no key, so health and metrics
    stay open."""
    docs = rendered[overlay]
    env = {e["name"]: e for e in container(docs).get("env", [])}
    ref = env["SEQSERVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is True and ref["name"] and ref["key"]
    assert "SEQSERVE_API_KEY" not in config_env(docs)
    assert not any(d["kind"] == "Secret" for d in docs)  # created by the operator, not here
    settings = effective_settings(docs)
    assert settings.api_key is None  # the Secret is absent when rendering: keys off
    assert settings.auth_health is False and settings.auth_metrics is False
    for probe in probes(docs).values():
        assert "httpHeaders" not in probe["httpGet"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_readme_shutdown_text_matches_the_manifests(rendered: Docs, overlay: str) -> None:
    """docs/deployment.md's shutdown paragraph quotes what the rendered pods do."""
    import re

    readme = (REPO / "docs" / "deployment.md").read_text()
    text = " ".join(re.search(r"^Shutdown: (.*?)\n\n", readme, re.M | re.S)
                    .group(1).split())  # type: ignore[union-attr]
    docs = rendered[overlay]
    settings = effective_settings(docs)
    has_pre_stop = pre_stop_sleep_s(docs) > 0
    assert ("there is no `preStop` hook" in text) == (not has_pre_stop), text
    assert ("preStop` sleeps" in text) == has_pre_stop, text
    assert f"`SEQSERVE_SHUTDOWN_DELAY_S` ({settings.shutdown_delay_s:g} s" in text, text
    assert f"`SEQSERVE_DRAIN_TIMEOUT_S` ({settings.drain_timeout_s:g} s" in text, text
    grace = pod_spec(docs)["terminationGracePeriodSeconds"]
    budget = settings.shutdown_delay_s + settings.drain_timeout_s + 5
    assert f"`terminationGracePeriodSeconds` ({grace})" in text, text
    assert f"shutdown delay + drain + 5 s ({budget:g})" in text, text
