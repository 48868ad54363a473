"""Clients that must not share the server's environment (kserve pins protobuf < 7 and psutil
< 6; lm-eval pulls datasets and transformers): each in its own virtualenv under
`.client-venvs/NAME`, made once from the registry and reused while its requirement stays.

`CLIENTS` is the one list of them; a test module names the one it uses as `VENV_NAME`. Once
the tests are collected, the session starts making the missing ones that collected tests use,
in the background (`warm`, from conftest.py), so that their downloads overlap the other tests;
a test that needs one waits for it under the same lock (`client_python`). `python
tests/client_venvs.py [NAME...]` makes them (all by default) in the foreground."""

from __future__ import annotations

import fcntl
import subprocess
import sys
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = {
    # guidellm requires torch (any release): pinned to the CPU wheel that lies on this
    # machine's disk, or pip takes a CUDA build (5.5 GB in the venv, enough to fill a CI
    # machine's disk)
    "guidellm": "guidellm==0.8.1 torch==2.13.0",
    "lm-eval": "lm-eval[api]==0.4.13",
    "kserve": "kserve==0.21.*",
    "tritonclient-grpc": "tritonclient[grpc]==2.73.*",
}
"""Each client's virtualenv name and its pip requirements (separated by spaces)."""


class InstallFailed(Exception):
    pass


def client_python(name: str) -> Path:
    """The Python of `.client-venvs/NAME` with its `CLIENTS` requirements installed (fails
    the test when the install does)."""
    try:
        return _made(name)
    except InstallFailed as exc:
        pytest.fail(str(exc))


def _made(name: str, timeout_s: float = 900) -> Path:
    requirement = CLIENTS[name]
    folder = ROOT / ".client-venvs" / name
    python = folder / "bin" / "python"
    stamp = folder / ".installed"
    folder.parent.mkdir(exist_ok=True)
    with open(folder.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one maker at a time (the warmer, xdist workers)
        if not stamp.exists() or stamp.read_text() != requirement:
            venv.EnvBuilder(with_pip=True, clear=True).create(folder)
            done = subprocess.run([str(python), "-m", "pip", "install", "-q",
                                   *requirement.split()],
                                  capture_output=True, text=True, timeout=timeout_s)
            if done.returncode:
                raise InstallFailed(f"installing {requirement} failed:\n{done.stderr[-3000:]}")
            stamp.write_text(requirement)
    return python


def missing(names: list[str]) -> list[str]:
    """Those of `names` whose virtualenv is not made (or made for another requirement)."""
    out = []
    for name in names:
        requirement = CLIENTS[name]
        stamp = ROOT / ".client-venvs" / name / ".installed"
        if not stamp.exists() or stamp.read_text() != requirement:
            out.append(name)
    return out


def warm(names: list[str]) -> subprocess.Popen[bytes] | None:
    """Start making those of `names` that are missing in a process of its own (None: none
    is); its output goes to `.client-venvs/warm.log`."""
    names = missing(names)
    if not names:
        return None
    (ROOT / ".client-venvs").mkdir(exist_ok=True)
    log = open(ROOT / ".client-venvs" / "warm.log", "wb")  # noqa: SIM115 (the child's)
    return subprocess.Popen([sys.executable, __file__, *names], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT)


def main(names: list[str]) -> int:
    names = missing(names or list(CLIENTS))
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {name: pool.submit(_made, name) for name in names}
    failed = 0
    for name, future in futures.items():
        try:
            print(f"{name}: {future.result()}", flush=True)
        except Exception as exc:  # reported; the test that needs it fails with it
            failed += 1
            print(f"{name}: {exc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
