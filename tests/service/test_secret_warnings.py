"""Weak secrets are served with a warning at start, never refused (issue 50): a state secret
under 32 bytes or of one repeated character, an API key under 16 characters, a key or
secret file its group or others may read. No warning holds the secret itself."""

from __future__ import annotations

import signal
from pathlib import Path

from process_support import serve
from service_fakes import settings

from seqserve.service.core.state_token import secret_warnings as state_secret_warnings
from seqserve.service.web.auth import secret_warnings

STRONG = "9f2c4e1a7b3d5f60" * 4  # 64 characters
KEY = "a-key-of-twenty-chars"


def _file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_strong_secrets_and_private_files_give_no_warning(tiny_repo: Path,
                                                          tmp_path: Path) -> None:
    secret = _file(tmp_path / "secret", STRONG + "\n")
    keys = _file(tmp_path / "keys", KEY + "\n")
    assert secret_warnings(settings(tiny_repo, api_key_file=keys,
                                    state_secret_file=secret)) == []
    assert secret_warnings(settings(tiny_repo, api_key=KEY)) == []
    assert secret_warnings(settings(tiny_repo)) == []


def test_a_short_or_repeated_state_secret_is_named(tmp_path: Path) -> None:
    short = _file(tmp_path / "short", f"{STRONG}\n{'0123456789abcdef0123'}\n")
    (warning,) = state_secret_warnings(short)
    assert "line 2" in warning and "20 bytes, under 32" in warning
    assert "0123456789abcdef0123" not in warning
    repeated = _file(tmp_path / "repeated", "x" * 40 + "\n")
    (warning,) = state_secret_warnings(repeated)
    assert "line 1" in warning and "one character repeated" in warning
    assert "xxxx" not in warning


def test_short_api_keys_and_loose_file_modes_are_named(tiny_repo: Path,
                                                       tmp_path: Path) -> None:
    (warning,) = secret_warnings(settings(tiny_repo, api_key="k"))
    assert "api_key: key 1 is 1 characters, under 16" in warning
    keys = _file(tmp_path / "keys", f"# keys\n{KEY}\nshort-key\n", 0o644)
    secret = _file(tmp_path / "secret", STRONG + "\n", 0o640)
    warnings = secret_warnings(settings(tiny_repo, api_key_file=keys,
                                        state_secret_file=secret))
    assert len(warnings) == 3, warnings
    assert "key 2 is 9 characters" in warnings[0] and "short-key" not in warnings[0]
    assert f"api_key file {keys}: mode 0644" in warnings[1] and "chmod 600" in warnings[1]
    assert f"--state-secret-file {secret}: mode 0640" in warnings[2]
    at_path = secret_warnings(settings(tiny_repo, api_key=f"@{keys}"))  # the @PATH form
    assert any("mode 0644" in w for w in at_path), at_path


def test_serve_logs_each_warning_once_and_serves(tiny_repo: Path, tmp_path: Path) -> None:
    keys = _file(tmp_path / "keys", "short\n", 0o644)
    secret = _file(tmp_path / "secret", "s" * 20 + "\n")
    with serve(tiny_repo, "--api-workers", "0", "--api-key-file", str(keys),
               "--state-secret-file", str(secret)) as server:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        out = server.output()
    assert out.count("key 1 is 5 characters, under 16") == 1, out
    assert out.count(f"api_key file {keys}: mode 0644") == 1, out
    assert out.count("line 1 is one character repeated") == 1, out
    assert "short\n" not in out and "s" * 20 not in out
