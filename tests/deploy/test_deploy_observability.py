"""Prometheus rules, the adapter rules and the Grafana dashboard against the real server.

Metric names are checked against a live `/metrics` scrape of a real `seqserve serve`, not
against docs/contracts.md: a rename in the server fails here. `promtool` (Debian package
`prometheus`, installed by deploy/install-test-tools.sh) checks the rules and the scrape.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    DEPLOY,
    adapter_rules,
    dashboard,
    dashboard_exprs,
    exported_series_names,
    http,
    referenced_metrics,
    rules_exprs,
)
from k8s_checks import effective_settings, probes

RULES = DEPLOY / "prometheus" / "rules.yaml"
Docs = dict[str, list[dict[str, Any]]]


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed: run deploy/install-test-tools.sh (Debian package "
                    "`prometheus`) as root")
    return exe


def test_promtool_check_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    rules = yaml.safe_load(RULES.read_text())
    rules["groups"][0]["rules"][0]["expr"] = "histogram_quantile(0.99, rate(seqserve_x[5m]"
    broken = tmp_path / "rules.yaml"
    broken.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(broken)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode != 0


def test_promtool_check_metrics_on_live_scrape(metrics_text: str) -> None:
    result = subprocess.run([promtool(), "check", "metrics"], input=metrics_text,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_metric_in_rules_dashboard_and_adapter_is_exported(metrics_text: str) -> None:
    exported = exported_series_names(metrics_text)
    sources = {"rules.yaml": rules_exprs(), "dashboard": dashboard_exprs(),
               "adapter": [r["seriesQuery"] + " " + r["metricsQuery"] for r in adapter_rules()]}
    for source, exprs in sources.items():
        named = set().union(*(referenced_metrics(e) for e in exprs))
        assert len(named) >= 3, f"{source} names too few metrics: {named}"
        missing = named - exported
        assert not missing, f"{source} uses metrics the server does not export: {missing}"


def test_rules_cover_the_four_golden_signals() -> None:
    rules = yaml.safe_load(RULES.read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    records = {r["record"]: r["expr"] for g in rules["groups"] for r in g["rules"]
               if "record" in r}
    exprs = " ".join(alerts.values()) + " " + " ".join(records.values())
    assert "seqserve_request_duration_seconds_bucket" in exprs and "0.99" in exprs
    assert re.search(r'seqserve_requests_total\{[^}]*status=~"5\.\."', exprs)
    assert "seqserve_queue_depth" in exprs and "seqserve_model_ready == 0" in exprs
    for name, expr in alerts.items():  # every alert reads a defined recording rule or a metric
        used = set(re.findall(r"seqserve:[a-z0-9_:]+", expr))
        assert used <= set(records), f"{name} uses undefined recording rules {used}"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_queue_alert_threshold_is_80_percent_of_queue_size(rendered: Docs,
                                                           overlay: str) -> None:
    rules = yaml.safe_load(RULES.read_text())
    expr = next(r["expr"] for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "SeqserveQueueSaturated")
    threshold = float(re.findall(r">\s*([0-9.]+)\s*$", expr)[0])
    queue_size = effective_settings(rendered[overlay]).queue_size
    assert threshold == int(0.8 * queue_size), (threshold, queue_size)


def test_dashboard_is_consistent() -> None:
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert {"datasource", "namespace", "model"} <= set(variables)
    # "All" models must not match the empty model label of the server's own endpoints.
    assert variables["model"]["allValue"] == ".+"
    graphs = [p for p in d["panels"] if p["type"] != "row"]
    assert len(graphs) >= 10
    for p in graphs:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert 'model=~"$model"' in t["expr"], (p["title"], t["expr"])
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_probe_paths_answer_on_a_live_server(rendered: Docs, overlay: str,
                                             live_server: str) -> None:
    for name, probe in probes(rendered[overlay]).items():
        status, body = http(f"{live_server}{probe['httpGet']['path']}")
        assert status == 200, (name, body)


def _contract_metrics() -> set[str]:
    text = (DEPLOY.parent / "docs" / "contracts.md").read_text()
    section = text[text.index("## Metric names"):]
    return set(re.findall(r"`(seqserve_[a-z0-9_]+)`", section))


def test_every_contract_metric_is_exported_and_on_the_dashboard(metrics_text: str) -> None:
    contract = _contract_metrics()
    assert len(contract) >= 10
    families = set(re.findall(r"^# TYPE (\S+) ", metrics_text, re.M))
    assert contract - families == set(), "docs/contracts.md metrics the server lacks"
    on_dashboard = set().union(*(referenced_metrics(e) for e in dashboard_exprs()))
    shown = {m for m in contract if any(n == m or n.startswith(m + "_") for n in on_dashboard)}
    assert contract - shown == set(), "contract metrics missing from the dashboard"
