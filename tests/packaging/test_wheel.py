"""The installed distribution exposes one import namespace: `seqserve` and nothing else.

A user's own project with a `models/` or `service/` package must neither shadow us nor be
shadowed, so the wheel holds `seqserve/` (and its dist-info) only, and a fresh virtualenv with
the wheel installed imports `seqserve` but none of the old top-level names.
"""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: build with this venv's setuptools (no index round trip)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(ROOT)], check=True, timeout=300,
                   capture_output=True)
    (found,) = out.glob("seqserve-*.whl")
    return found


def test_wheel_holds_only_the_seqserve_namespace(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/")[0] for name in zf.namelist()}
    dist_info = {t for t in tops if t.endswith(".dist-info")}
    assert len(dist_info) == 1 and tops - dist_info == {"seqserve"}, sorted(tops)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    for pkg in ("models", "export", "service", "loadtest"):
        assert f"seqserve/{pkg}/__init__.py" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    with zipfile.ZipFile(wheel) as zf:
        assert "seqserve = seqserve.cli:main" in zf.read(entry).decode()


def test_fresh_venv_imports_seqserve_and_no_old_top_level_names(wheel: Path,
                                                                tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, system_site_packages=False)
    py = env_dir / "bin" / "python"
    # install the wheel's files alone (no dependencies): a plain unzip into site-packages is
    # what pip does for a pure-Python wheel
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True
                          ).stdout.strip()
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    code = ("import importlib.util, seqserve\n"
            "print(seqserve.__version__)\n"
            "for name in ('models', 'export', 'service', 'loadtest'):\n"
            "    assert importlib.util.find_spec(name) is None, name\n"
            "for name in ('seqserve.models', 'seqserve.export', 'seqserve.service',"
            " 'seqserve.loadtest'):\n"
            "    assert importlib.util.find_spec(name) is not None, name\n")
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
