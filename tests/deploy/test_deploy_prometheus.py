"""A real Prometheus on 127.0.0.1 scrapes a real seqserve; PromQL reads the results back.

Prometheus (Debian package `prometheus`) runs with a temporary config: scrape every second,
the project's rule file (group intervals set to 1 s, the one substitution), and the labels a
Kubernetes scrape would attach (`namespace`, `pod`), so that the prometheus-adapter queries
and the dashboard's queries run exactly as written. Every wait is bounded.
"""

from __future__ import annotations

import json
import math
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    DEPLOY,
    adapter_rules,
    dashboard,
    free_port,
    http,
    running,
    send_traffic,
    wait_for,
)

POD = {"namespace": "seqserve-test", "pod": "seqserve-cpu-0"}
WAIT_S = 90.0
# Dashboard panels that must show data once classify and translate traffic went through.
PANELS_WITH_DATA = {"Requests per second by status", "Request latency p50 / p99",
                    "Queue depth", "Requests in flight per pod (HPA metric)", "Model ready",
                    "Generated tokens / s and decode steps / s",
                    "Time to first token p50 / p99", "Inter-token latency p50 / p99",
                    "Live sequences"}


def _config(tmp: Path, target: str) -> Path:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules.yaml")],
        "scrape_configs": [{"job_name": "seqserve", "metrics_path": "/metrics",
                            "static_configs": [{"targets": [target], "labels": POD}]}],
    }
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


class PromQL:
    """The HTTP API of one Prometheus."""

    def __init__(self, base: str) -> None:
        self.base = base

    def query(self, expr: str) -> list[dict[str, Any]]:
        status, body = http(f"{self.base}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}))
        answer = json.loads(body)
        assert status == 200 and answer["status"] == "success", (expr, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def rules(self) -> list[dict[str, Any]]:
        status, body = http(f"{self.base}/api/v1/rules")
        assert status == 200
        groups: list[dict[str, Any]] = json.loads(body)["data"]["groups"]
        return groups


def _until(predicate: Any, what: str, traffic_to: str | None = None) -> Any:
    """Poll `predicate()` (sending traffic between polls) until it returns a truthy value."""
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        if traffic_to:
            send_traffic(traffic_to, n=2)
        time.sleep(0.5)
    raise TimeoutError(f"Prometheus never showed {what} within {WAIT_S} s")


@pytest.fixture(scope="module")
def prom(live_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromQL]:
    exe = shutil.which("prometheus")
    if exe is None:
        pytest.skip("prometheus not installed: run deploy/install-test-tools.sh (Debian "
                    "package `prometheus`) as root")
    tmp = tmp_path_factory.mktemp("prometheus")
    port = free_port()
    target = live_server.removeprefix("http://")
    argv = [exe, f"--config.file={_config(tmp, target)}", f"--storage.tsdb.path={tmp / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with running(argv, tmp / "prometheus.log") as proc:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/-/ready", WAIT_S, proc.proc, proc.log)
        api = PromQL(base)
        _until(lambda: [r for r in api.query('up{job="seqserve"}') if r["value"][1] == "1"],
               "the seqserve target up")
        yield api


def test_p99_latency_through_promql(prom: PromQL, live_server: str) -> None:
    expr = ('histogram_quantile(0.99, sum by (le, model) '
            '(rate(seqserve_request_duration_seconds_bucket{model="tiny-clf"}[30s])))')

    def finite() -> list[dict[str, Any]]:
        return [r for r in prom.query(expr) if math.isfinite(float(r["value"][1]))]

    result = _until(finite, "a finite p99 of tiny-clf", traffic_to=live_server)
    p99 = float(result[0]["value"][1])
    assert result[0]["metric"] == {"model": "tiny-clf"}
    assert 0 < p99 <= 30.0  # within the histogram's finite buckets


def test_recording_and_alerting_rules_evaluate(prom: PromQL, live_server: str) -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())
    names = {r.get("record") or r.get("alert") for g in rules["groups"] for r in g["rules"]}
    _until(lambda: prom.query('seqserve:request_duration_seconds:p99_5m{model="tiny-clf"}'),
           "the p99 recording rule", traffic_to=live_server)
    _until(lambda: prom.query("seqserve:requests:rate5m"), "the request rate rule")
    def evaluated() -> dict[str, dict[str, Any]]:
        loaded = {r["name"]: r for g in prom.rules() for r in g["rules"]}
        done = all(not r.get("lastEvaluation", "0001").startswith("0001")
                   for r in loaded.values())
        return loaded if done and names <= set(loaded) else {}

    loaded = _until(evaluated, "every rule loaded and evaluated")
    bad = {n: r.get("lastError") for n, r in loaded.items() if r["health"] != "ok"}
    assert not bad, bad
    # Healthy server, no 5xx, models ready: no alert may fire.
    firing = [r["name"] for g in prom.rules() for r in g["rules"]
              if r.get("type") == "alerting" and r.get("alerts")]
    assert not firing, firing


def test_adapter_queries_give_a_per_pod_value(prom: PromQL, live_server: str) -> None:
    matchers = f'namespace="{POD["namespace"]}",pod="{POD["pod"]}"'
    for rule in adapter_rules():
        series = rule["seriesQuery"].split("{")[0]
        expr = (rule["metricsQuery"].replace("<<.Series>>", series)
                .replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod"))
        result = _until(lambda e=expr: prom.query(e), f"adapter metric {rule['name']['as']}",
                        traffic_to=live_server)
        assert [r["metric"] for r in result] == [{"pod": POD["pod"]}], (expr, result)
        assert float(result[0]["value"][1]) >= 0


def test_dashboard_queries_run(prom: PromQL, live_server: str) -> None:
    send_traffic(live_server, n=3)
    time.sleep(2.5)  # two scrapes after the traffic (a wait, never a pass/fail timing)
    empty = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = (target["expr"].replace("$namespace", ".*").replace("$model", ".+")
                    .replace("$__rate_interval", "1m"))
            if not prom.query(expr) and panel["title"] in PANELS_WITH_DATA:
                empty.append((panel["title"], expr))
    assert not empty, empty
