"""Clients that must not share the server's environment (kserve pins protobuf < 7 and psutil
< 6; lm-eval pulls datasets and transformers): each in its own virtualenv under
`.client-venvs/NAME`, made once from the registry and reused while its requirement stays."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def client_python(name: str, requirement: str, timeout_s: float = 900) -> Path:
    """The Python of `.client-venvs/NAME` with `requirement` (one or more pip requirements,
    separated by spaces) installed (fails the test when the install does)."""
    folder = ROOT / ".client-venvs" / name
    python = folder / "bin" / "python"
    stamp = folder / ".installed"
    if not stamp.exists() or stamp.read_text() != requirement:
        venv.EnvBuilder(with_pip=True, clear=True).create(folder)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", *requirement.split()],
                              capture_output=True, text=True, timeout=timeout_s)
        if done.returncode:
            pytest.fail(f"installing {requirement} failed:\n{done.stderr[-3000:]}")
        stamp.write_text(requirement)
    return python
