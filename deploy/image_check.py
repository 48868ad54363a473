"""Checks a running seqserve image from inside it; run by deploy/build-image.sh.

    python - BASE_URL EXPECTED_UID [--models DIR] [--ready-deadline S] < deploy/image_check.py

(the image's python, stdlib only; --models defaults to /models, the image's bundles).

Runs as the image's user, in the container the server runs in (buildah's chroot isolation
shares the host's network, so BASE_URL is the server's 127.0.0.1 port). Prints one line per
check, `check <name>: ok <detail>` or `check <name>: FAILED <why>`, and exits 1 if any failed.
Every bundle of the models folder is asked once through its task's v1 route, a classifier also
through the Open Inference Protocol (v2 infer, what KServe sends).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROUTES = {"classifier": "classify", "translator": "translate", "tagger": "tag"}
SAMPLE = "one two three"
failed: list[str] = []


def report(name: str, ok: bool, detail: str) -> None:
    print(f"check {name}: {'ok' if ok else 'FAILED'} {detail}", flush=True)
    if not ok:
        failed.append(name)


def http(url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_ready(base: str, deadline_s: float) -> tuple[bool, str]:
    end = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < end:
        try:
            status, body = http(f"{base}/v2/health/ready", timeout=2)
            if status == 200:
                return True, f"after {deadline_s - (end - time.monotonic()):.1f} s"
            last = f"{status} {body[:200]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.5)
    return False, f"not ready within {deadline_s:.0f} s (last: {last})"


def baked_models(models: Path) -> dict[str, str]:
    """name -> task of every bundle under `models` (NAME/VERSION/manifest.json)."""
    found: dict[str, str] = {}
    for manifest in sorted(models.glob("*/*/manifest.json")):
        found[manifest.parent.parent.name] = json.loads(manifest.read_text())["task"]
    return found


def main(base: str, expected_uid: int, models_dir: Path, ready_deadline_s: float) -> int:
    uid = os.getuid()
    report("non-root-user", uid == expected_uid and uid != 0,
           f"uid {uid} (image USER {expected_uid})")
    report("no-torch", importlib.util.find_spec("torch") is None,
           "torch is not importable" if importlib.util.find_spec("torch") is None
           else "torch IS importable")

    ok, detail = wait_ready(base, ready_deadline_s)
    report("health-ready", ok, detail)
    if not ok:
        return 1
    models = baked_models(models_dir)
    for task, route in ROUTES.items():
        names = [n for n, t in models.items() if t == task]
        if not names:
            report(route, False, f"no {task} bundle under {models_dir}")
            continue
        for name in names:
            status, body = http(f"{base}/v1/models/{name}/{route}", {"texts": [SAMPLE]})
            results = json.loads(body).get("results") if status == 200 else None
            report(route, status == 200 and isinstance(results, list) and len(results) == 1,
                   f"{name}: {status} {body[:160]!r}")
        if task == "classifier":
            name = names[0]
            v2 = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                              "data": [SAMPLE]}]}
            status, body = http(f"{base}/v2/models/{name}/infer", v2)
            outputs = json.loads(body).get("outputs") if status == 200 else None
            report("v2-infer", status == 200 and bool(outputs),
                   f"{name}: {status} {body[:160]!r}")

    status, body = http(f"{base}/metrics")
    text = body.decode(errors="replace")
    answered = [line for line in text.splitlines()
                if line.startswith("seqserve_requests_total{") and 'status="200"' in line]
    report("metrics", status == 200 and "# TYPE seqserve_" in text and bool(answered),
           f"{status}, {len(text)} bytes, {len(answered)} request series with status 200")
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base_url")
    parser.add_argument("expected_uid", type=int)
    parser.add_argument("--models", type=Path, default=Path("/models"))
    parser.add_argument("--ready-deadline", type=float, default=180.0)
    args = parser.parse_args()
    sys.exit(main(args.base_url.rstrip("/"), args.expected_uid, args.models,
                  args.ready_deadline))
