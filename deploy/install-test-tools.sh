#!/usr/bin/env bash
# Installs the system tools that tests/deploy needs, on a fresh Debian machine, as root:
#   promtool + prometheus (Debian package `prometheus`): `promtool check rules|metrics` and
#   the integration test that runs a real Prometheus on 127.0.0.1.
# The Python tools (hadolint, kubectl with kustomize, kubernetes-validate, the ServiceMonitor
# schema) come from the `dev` extra in pyproject.toml. Idempotent; does not start any service.
set -euo pipefail

if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    echo "install-test-tools: promtool and prometheus already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    # Not fatal: the promtool/Prometheus tests then skip and say why.
    echo "install-test-tools: not root, cannot apt-get install prometheus;" \
         "tests needing promtool/prometheus will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# --no-install-recommends: no node exporter / alertmanager; the package's service is not
# started where there is no systemd (containers, CI), and the tests start their own server.
apt-get install -y -q --no-install-recommends prometheus
promtool --version | head -1
