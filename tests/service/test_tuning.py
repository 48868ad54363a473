"""`--layout auto`, `--api-workers auto`, `--instances auto`: the layout chosen for a machine,
and its cores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqserve.service.server.layout import (
    cgroup_cpu_limit,
    describe,
    memory_bytes,
    repository_bytes,
    resolve,
    resolved_sources,
    sources,
    speed_block,
)
from seqserve.service.web.settings import Settings


def test_auto_layout_on_a_two_core_cpu_is_hybrid() -> None:
    """auto on a CPU: the hybrid layout, one API process per core with its own models."""
    s = resolve(Settings(), available=2)
    assert (s.layout, s.api_workers, s.instances, s.intra_op_threads) == ("hybrid", 2, 1, 1)
    assert "2 API process(es), each with its own models (hybrid)" in describe(s)
    assert "sessions: in 1 engine process" in describe(s)
    assert resolve(Settings(), available=8).api_workers == 8
    assert s.decode_groups == 1  # a translator per process: one decoder group each


def test_the_engine_layout_on_a_cpu() -> None:
    s = resolve(Settings(layout="engine"), available=2)
    assert (s.api_workers, s.instances, s.intra_op_threads) == (1, 2, 1)
    assert "1 API process(es) + 1 engine process" in describe(s)
    eight = resolve(Settings(layout="engine"), available=8)
    assert (eight.api_workers, eight.instances, eight.intra_op_threads) == (4, 4, 1)
    assert s.decode_groups == 2 and resolve(Settings(layout="engine", decode_groups=3),
                                            available=2).decode_groups == 3


def test_runtime_calls_run_on_the_loop_only_behind_the_native_front_with_one_instance(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: the event loop's thread runs the decode loops' runtime calls (steps) where each
    API process has its own models with one instance on a CPU and the native front is built
    (it reads requests while a call runs); threads for several instances, a GPU, the
    uvicorn front, a native front that is not built, the engine layout and the one-process
    server. A given value is kept; decode groups are 1 where no thread would overlap them."""
    from seqserve.service.server import native

    def calls(**kw: object) -> tuple[str, int]:
        s = resolve(Settings(**kw), available=2)  # type: ignore[arg-type]
        return s.runtime_calls, int(s.decode_groups)

    built = native.native_front()[0] is not None
    assert calls() == (("steps", 1) if built else ("threads", 1))
    assert calls(layout="replicated") == (("steps", 1) if built else ("threads", 1))
    assert calls(api_workers=0) == ("threads", 2)
    assert calls(front="uvicorn") == ("threads", 1)
    assert calls(instances=2) == ("threads", 1)
    assert calls(layout="engine") == ("threads", 2)
    assert calls(device="cuda") == ("threads", 2)
    assert calls(runtime_calls="threads") == ("threads", 1)
    assert calls(layout="engine", runtime_calls="loop") == ("loop", 1)
    assert calls(layout="engine", runtime_calls="steps") == ("steps", 1)
    monkeypatch.setattr(native, "native_front", lambda: (None, "not built"))
    assert calls() == ("threads", 1)


def test_auto_layout_on_a_gpu_node_is_the_engine() -> None:
    s = resolve(Settings(device="cuda"), available=16)
    assert (s.layout, s.api_workers, s.instances, s.intra_op_threads) == ("engine", 14, 2, 0)


def test_auto_layout_keeps_one_copy_when_copies_per_core_would_not_fit(tmp_path: Path) -> None:
    """A copy of the repository per core must fit in a quarter of the memory, else auto
    picks the engine layout (one copy)."""
    bundle = tmp_path / "big" / "1"
    bundle.mkdir(parents=True)
    (bundle / "manifest.json").write_text("{}")
    (bundle / "model.onnx").write_bytes(b"x" * 1000)
    size = repository_bytes(tmp_path)
    assert size == 1002
    roomy = resolve(Settings(repo=tmp_path), available=4, memory=4 * 4 * size)
    assert roomy.layout == "hybrid"
    tight = resolve(Settings(repo=tmp_path), available=4, memory=4 * 4 * size - 1)
    assert (tight.layout, tight.api_workers, tight.instances) == ("engine", 2, 2)
    assert resolve(Settings(repo=tmp_path, layout="hybrid"), available=4,
                   memory=1).layout == "hybrid"  # a given layout is kept


def test_memory_reads_the_container_limit(tmp_path: Path) -> None:
    machine = memory_bytes(tmp_path)
    assert machine is not None and machine > 0
    (tmp_path / "memory.max").write_text("1048576\n")
    assert memory_bytes(tmp_path) == 1048576
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_bytes(tmp_path) == machine


def test_auto_replicated_layout_is_one_process_per_core_with_one_instance_each() -> None:
    s = resolve(Settings(layout="replicated"), available=2)
    assert (s.api_workers, s.instances, s.intra_op_threads) == (2, 1, 1)
    assert "2 API process(es), each with its own models (replicated)" in describe(s)
    assert "engine" not in describe(s)
    assert resolve(Settings(layout="replicated"), available=8).api_workers == 8
    given = resolve(Settings(layout="replicated", api_workers=3, instances=2), available=8)
    assert (given.api_workers, given.instances) == (3, 2)
    gpu = resolve(Settings(layout="replicated", device="cuda"), available=16)
    assert (gpu.api_workers, gpu.instances) == (1, 1)


def test_given_values_are_kept() -> None:
    s = resolve(Settings(layout="engine", api_workers=3, instances=2, intra_op_threads=4),
                available=2)
    assert (s.api_workers, s.instances, s.intra_op_threads) == (3, 2, 4)
    one = resolve(Settings(api_workers=0), available=8)
    assert one.api_workers == 0 and one.instances == 4 and "one process" in describe(one)


def test_container_cpu_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_each_setting_says_where_it_came_from() -> None:
    given = Settings(max_batch_size=8, max_wait_ms=5.0, instances=3, layout="engine")
    env = {"SEQSERVE_MAX_WAIT_MS": "5", "seqserve_instances": "3"}  # any case, as pydantic
    origin = sources(given, cli={"max_batch_size"}, env=env)
    assert origin["max_batch_size"] == "cli --max-batch-size"
    assert origin["max_wait_ms"] == "env SEQSERVE_MAX_WAIT_MS"
    assert origin["instances"] == "env SEQSERVE_INSTANCES"
    assert origin["max_queue_wait_s"] == "default"
    assert sources(Settings(max_texts=7), env={})["max_texts"] == "set by the caller"
    assert origin["layout"] == "set by the caller"
    after = resolve(given, available=2)
    final = resolved_sources(given, after, origin, available=2)
    assert final["api_workers"] == "auto: 2 cores, cpu (default was 'auto')"
    assert final["intra_op_threads"] == "default"  # instances given: threads stay 0
    block = speed_block(after, final).splitlines()
    assert block[0].startswith("serving settings (1 API process(es) + 1 engine process, 3 ")
    assert block[1].split() == ["layout", "engine", "set", "by", "the", "caller"]
    assert block[4].split() == ["intra_op_threads", "0", "(runtime", "default)", "default"]
    assert block[5].split() == ["max_batch_size", "8", "cli", "--max-batch-size"]
    assert block[-1].startswith("  translators and language models decode: one decode loop "
                                "per model in the engine process")
    hybrid = speed_block(resolve(Settings(), available=2), final).splitlines()[-1]
    assert "in each API process" in hybrid and "section 18" in hybrid


def test_the_start_up_block_in_json_logs(capsys: pytest.CaptureFixture[str]) -> None:
    from seqserve.cli.serve import print_speed_settings

    s = resolve(Settings(log_format="json", layout="engine"), available=2)
    print_speed_settings(s, resolved_sources(Settings(), s, sources(Settings(), env={}), 2))
    (line,) = capsys.readouterr().err.splitlines()
    doc = json.loads(line)
    assert doc["message"] == "serving settings" and doc["level"] == "info"
    assert doc["decoders"].startswith("one decode loop per model in the engine process")
    assert doc["settings"]["instances"] == {"value": 2,
                                            "source": "auto: 2 cores, cpu (default was 'auto')"}
    assert doc["settings"]["max_batch_size"] == {"value": 16, "source": "default"}
