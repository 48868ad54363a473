"""Settings: SEQSERVE_* environment variables with CLI flags on top."""

from __future__ import annotations

from pathlib import Path

import pytest

from seqserve.models.errors import UserError
from seqserve.service.cli import build_parser, main
from seqserve.service.cli.serve import settings_from_args
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
