"""The serving image, built and served by the project itself (deploy/build-image.sh).

The script builds the Dockerfile's `cpu` target with buildah (chroot isolation, no Docker
engine), baking the tiny bundles of this session (classifier, translator, tagger), then runs
the image and checks it over HTTP. As root on Debian it installs buildah and debootstrap itself
when they are missing (CI's fresh machine). Measured on 2 cores: cold (no buildah, no cached
base: apt-get install + debootstrap of bookworm + build + checks) 114 s for the script, 2 min
20 s for this file with its fixtures; warm 47 s (build 32 s) and 76 s, before the build stage
built the native front (Debian's Rust packages apt-installed, then compiled: 3 min 30 s for
this file, warm base, docs/performance.md section 33). The checks themselves are
shown to fail on a server that lacks what they ask for (`image_check.py` against the live test
server).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_support import DEPLOY, REPO

SCRIPT = DEPLOY / "build-image.sh"
CHECK = DEPLOY / "image_check.py"
TAG = "localhost/seqserve-test:cpu"
# Every check the script prints for an image baked with one bundle of each task.
EXPECTED_CHECKS = ("non-root-user", "no-torch", "health-ready", "classify", "v2-infer",
                   "translate", "tag", "metrics", "healthcheck", "native-front", "server-uid",
                   "sigterm-exit")
NO_DISK = 3  # build-image.sh's exit status when the machine lacks the disk to build
BUILD_TIMEOUT_S = 1500  # cold: apt-get install buildah + debootstrap + build, on a busy machine


def _checks(output: str) -> dict[str, str]:
    """name -> 'ok' | 'FAILED' of each `check NAME: ...` line (FAILED wins over ok)."""
    seen: dict[str, str] = {}
    for name, verdict in re.findall(r"^check ([\w-]+): (ok|FAILED)\b", output, re.M):
        if seen.get(name) != "FAILED":
            seen[name] = verdict
    return seen


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S + 60)
@pytest.mark.skipif(os.geteuid() != 0,
                    reason="buildah with chroot isolation (and installing it) needs root")
def test_build_image_builds_serves_and_checks(tiny_full_repo: Path) -> None:
    result = subprocess.run(["bash", str(SCRIPT), "cpu", "--bundles", str(tiny_full_repo),
                             "--tag", TAG], cwd=REPO, capture_output=True, text=True,
                            timeout=BUILD_TIMEOUT_S)
    output = result.stdout + result.stderr
    tail = output[-6000:]
    if result.returncode == NO_DISK and "build-image: not enough disk" in result.stderr:
        pytest.skip(result.stderr.strip().splitlines()[-1])  # a machine that cannot hold it
    assert result.returncode == 0, tail
    checks = _checks(result.stdout)
    assert checks == dict.fromkeys(EXPECTED_CHECKS, "ok"), tail
    assert "build-image: all checks passed" in result.stdout, tail
    assert "HEALTHCHECK is not supported" not in output  # buildah's warning for OCI format
    size = re.search(r"^build-image: image \S+ size ([\d.]+ [kMG]B)$", result.stdout, re.M)
    assert size, tail
    # What was baked is what the image holds: every bundle folder of the session's repository.
    ctr = subprocess.run(["buildah", "from", "--quiet", TAG], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    try:
        listing = subprocess.run(["buildah", "run", "--isolation", "chroot", ctr, "--",
                                  "ls", "/models"], capture_output=True, text=True, timeout=60)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, timeout=60)
    assert sorted(listing.stdout.split()) == sorted(p.name for p in tiny_full_repo.iterdir())
    # The script's own account (base, build and check times, size): shown with `pytest -s`.
    print("\n".join(line for line in result.stdout.splitlines()
                    if line.startswith("build-image:")))


def test_image_checks_fail_on_what_is_missing(live_server: str, tiny_repo: Path) -> None:
    """The checks are live: against a server with no tagger, run as another uid than expected
    and with torch importable (this dev environment), exactly those checks fail."""
    result = subprocess.run([sys.executable, str(CHECK), live_server, str(os.getuid() + 1),
                             "--models", str(tiny_repo), "--ready-deadline", "30"],
                            capture_output=True, text=True, timeout=120)
    checks = _checks(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    assert checks == {"non-root-user": "FAILED", "no-torch": "FAILED", "health-ready": "ok",
                      "classify": "ok", "v2-infer": "ok", "translate": "ok", "tag": "FAILED",
                      "metrics": "ok"}, result.stdout
