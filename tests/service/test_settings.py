"""Settings: SEQSERVE_* environment variables with CLI flags on top."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqserve.cli import build_parser, main
from seqserve.cli.serve import settings_from_args
from seqserve.models.errors import UserError
from seqserve.service.web.settings import Settings


def test_env_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSERVE_MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("SEQSERVE_PROVIDERS", "CUDAExecutionProvider, CPUExecutionProvider")
    monkeypatch.setenv("SEQSERVE_TRUNCATE", "true")
    args = build_parser().parse_args(["serve", "--max-wait-ms", "7"])
    s = settings_from_args(args)
    assert (s.max_batch_size, s.max_wait_ms, s.truncate) == (8, 7.0, True)
    assert s.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    args = build_parser().parse_args(["serve", "--max-batch-size", "4", "--no-truncate"])
    s = settings_from_args(args)
    assert (s.max_batch_size, s.truncate) == (4, False)


def test_every_settings_field_has_a_flag_with_its_description_and_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for name, field in Settings.model_fields.items():
        assert "--" + name.replace("_", "-") in text, name
        assert f"SEQSERVE_{name.upper()}" in text, name
        assert field.description and " ".join(field.description.split()) in text, name
    assert "[default: 16;" in text and "[default: onnx;" in text


def test_invalid_settings_are_user_errors(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--max-batch-tokens", "8", "--max-tokens", "64"])
    with pytest.raises(UserError, match="max_batch_tokens"):
        settings_from_args(args)
    assert main(["serve", "--repo", str(tmp_path / "missing")]) == 2


def test_admin_config_shows_the_effective_values_and_never_the_key(tiny_repo: Path) -> None:
    import httpx
    from pydantic import SecretStr
    from service_fakes import serve_in_thread

    from seqserve.service.server.app import create_app

    key = "k-7f3a-never-shown"
    settings = Settings(repo=tiny_repo, warmup=False, api_key=SecretStr(key), max_batch_size=8,
                        decode_groups=1, switch_interval_ms=0.7)
    with serve_in_thread(create_app(settings)) as url:
        assert httpx.get(f"{url}/v1/admin/config").status_code == 401  # behind the key
        r = httpx.get(f"{url}/v1/admin/config", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200 and key not in r.text
    api, engine = r.json()["api"], r.json()["engine"]
    assert api["settings"]["api_key"] == "set" and api["settings"]["max_batch_size"] == 8
    assert engine["mode"] == "in process" and engine["options"] == api["engine_options"]
    assert engine["options"]["process"]["switch_interval_ms"] == 0.7
    assert engine["models"]["tiny-clf/1"]["batcher"]["max_batch_size"] == 8
    assert engine["models"]["tiny-mt/1"]["decode"]["groups"] == 1
    assert engine["models"]["tiny-mt/1"]["decode"]["max_admit"] == 8


def test_engine_options_come_from_the_settings_and_survive_json() -> None:
    from seqserve.service.engine.options import EngineOptions
    from seqserve.service.server.composition import engine_options

    settings = Settings(max_batch_size=8, max_wait_ms=3.0, drain_timeout_s=7.0,
                        log_format="json", switch_interval_ms=0.25, providers=["A", "B"])
    options = engine_options(settings)
    assert EngineOptions.from_json(options.to_json()) == options
    assert (options.max_batch_size, options.max_wait_s, options.drain_timeout_s) == (8, 0.003, 7.0)
    assert options.process == settings.process_settings()
    assert options.process.log_format == "json" and options.process.switch_interval_ms == 0.25
    assert options.runtime.providers == ("A", "B")
    config = options.model_config(max_tokens=64)
    assert config.batcher.max_batch_size == config.decode.max_admit == 8
    assert config.batcher.queue_size == config.decode.max_queue == settings.queue_size


def test_the_live_hypothesis_cap_follows_the_device_unless_given() -> None:
    """auto: 256 live hypotheses a decoder step on a CPU (a step's cost a row rises past
    ~200 rows there), 1,024 on CUDA; resolved for the start-up block and the engine options
    alike; a number given is kept; less than the largest beam is refused."""
    from seqserve.service.server.composition import engine_options
    from seqserve.service.server.layout import resolve
    from seqserve.service.web.settings import LIVE_HYPOTHESES_CPU, LIVE_HYPOTHESES_CUDA

    assert Settings().max_live_hypotheses == "auto"
    assert (LIVE_HYPOTHESES_CPU, LIVE_HYPOTHESES_CUDA) == (256, 1024)
    assert resolve(Settings(), available=2).max_live_hypotheses == 256
    assert resolve(Settings(device="cuda"), available=2).max_live_hypotheses == 1024
    assert resolve(Settings(max_live_hypotheses=600), available=2).max_live_hypotheses == 600
    for settings, cap in [(Settings(), 256), (Settings(device="cuda"), 1024),
                          (Settings(max_live_hypotheses=40), 40)]:
        options = engine_options(settings)
        assert options.max_live_hypotheses == cap
        assert options.model_config(64).decode.max_live_hypotheses == cap
    assert Settings(max_live_hypotheses="auto").live_hypotheses == 256
    with pytest.raises(ValueError, match="max_live_hypotheses"):  # (pydantic's error)
        Settings(max_live_hypotheses="many")


def test_the_layout_counts_are_resolved_in_the_composition_root_not_defaulted() -> None:
    """`Settings.engine_options` has no fallback for "auto" (each held for one layout only):
    the composition root resolves instances, decode groups and where runtime calls run, as
    `seqserve serve` resolved them, else as the one-process server on one core (the same on
    every machine)."""
    from seqserve.service.server.composition import engine_options, resolved
    from seqserve.service.server.layout import resolve

    with pytest.raises(ValueError, match="resolve them for the layout"):
        Settings().engine_options()
    one = resolved(Settings())
    assert (one.api_workers, one.instances, one.decode_groups, one.runtime_calls) == \
        (0, 1, 2, "threads")
    assert resolved(one) is one
    served = resolve(Settings(layout="replicated"), available=4)
    assert resolved(served) is served and engine_options(served).decode_groups == 1
    given = engine_options(Settings(instances=3, decode_groups=4))
    assert (given.instances, given.decode_groups, given.runtime_calls) == (3, 4, "threads")
    for calls, batches, steps in [("loop", "loop", "loop"), ("steps", "threads", "loop"),
                                  ("threads", "threads", "threads")]:
        model = engine_options(Settings(instances=1, decode_groups=1, runtime_calls=calls)
                               ).model_config(64)  # steps: the decode loops' calls only
        assert (model.batcher.runtime_calls, model.decode.runtime_calls) == (batches, steps)
    held = engine_options(Settings(instances=1, decode_groups=1, decode_admit_steps=3))
    assert engine_options(Settings(instances=1, decode_groups=1)).model_config(64) \
        .decode.admit_steps == 4 and held.model_config(64).decode.admit_steps == 3
    assert Settings(instances=1, decode_groups=1, runtime_calls="loop").engine_options(
        engine_process=True).runtime_calls == "threads"  # the engine process: threads
