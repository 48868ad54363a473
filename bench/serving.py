"""What the benches that start `seqserve serve` share: waiting for its readiness."""

from __future__ import annotations

import subprocess
import time


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180,
               path: str = "/v2/health/ready") -> None:
    """Return once `url + path` answers 200; RuntimeError when the server exits first or is
    not ready within `timeout_s` (it is killed then)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.args!r}")
        try:
            if httpx.get(url + path, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server not ready in {timeout_s:g} s: {proc.args!r}")
