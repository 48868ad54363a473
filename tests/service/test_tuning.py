"""`--api-workers auto`, `--instances auto`: the layout chosen for a machine, and its cores."""

from __future__ import annotations

from pathlib import Path

from seqserve.service.server.layout import cgroup_cpu_limit, describe, resolve
from seqserve.service.web.settings import Settings


def test_auto_layout_on_a_two_core_cpu() -> None:
    s = resolve(Settings(), available=2)
    assert (s.api_workers, s.instances, s.intra_op_threads) == (1, 2, 1)
    assert "1 API process(es) + 1 engine process" in describe(s)
    eight = resolve(Settings(), available=8)
    assert (eight.api_workers, eight.instances, eight.intra_op_threads) == (4, 4, 1)


def test_auto_layout_on_a_gpu_node() -> None:
    s = resolve(Settings(device="cuda"), available=16)
    assert (s.api_workers, s.instances, s.intra_op_threads) == (14, 2, 0)


def test_given_values_are_kept() -> None:
    s = resolve(Settings(api_workers=3, instances=2, intra_op_threads=4), available=2)
    assert (s.api_workers, s.instances, s.intra_op_threads) == (3, 2, 4)
    one = resolve(Settings(api_workers=0), available=8)
    assert one.api_workers == 0 and one.instances == 4 and "one process" in describe(one)


def test_container_cpu_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None
