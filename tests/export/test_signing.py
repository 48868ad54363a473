"""Signed bundles: `seqserve sign`, `verify --trusted-keys` and `serve --trusted-keys` (an
unsigned, mis-signed or foreign-signed version fails with its reason; a signed one serves)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest
from service_fakes import serve_in_thread

from seqserve.cli import main
from seqserve.export.manifest import manifest_checksum
from seqserve.export.signing import check_signed, load_trusted, new_key
from seqserve.models.errors import BundleError, UserError
from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load
MODEL = "tiny-clf"


@pytest.fixture()
def repo(tiny_repo: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_repo, tmp_path / "repo"))


def test_sign_verify_and_serve_only_trusted_bundles(repo: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other"
    assert main(["sign", "--new-key", str(keys), "--name", "release"]) == 0
    private = keys / "release.key"
    assert private.stat().st_mode & 0o077 == 0 and (keys / "release.pub").is_file()
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    shutil.copy(keys / "release.pub", trusted)
    new_key(other, "stranger")

    v1, v2, v3, v4 = (repo / MODEL / str(v) for v in (1, 2, 3, 4))
    for v in (v2, v3, v4):
        shutil.copytree(v1, v)
        data = json.loads((v / "manifest.json").read_text())
        data["version"] = int(v.name)
        data["manifest_sha256"] = manifest_checksum(data)
        (v / "manifest.json").write_text(json.dumps(data, indent=2))
    assert main(["sign", str(v1), str(v2), "--key", str(private)]) == 0
    # v2: its manifest edited after signing (re-checksummed, so only the signature tells)
    data = json.loads((v2 / "manifest.json").read_text())
    data["labels"] = list(reversed(data["labels"]))
    data["manifest_sha256"] = manifest_checksum(data)
    (v2 / "manifest.json").write_text(json.dumps(data, indent=2))
    assert main(["sign", str(v3), "--key", str(other / "stranger.key")]) == 0  # not trusted
    # v4 stays unsigned
    capsys.readouterr()

    assert main(["verify", str(v1), "--no-parity", "--trusted-keys", str(trusted)]) == 0
    assert "signed by trusted key" in capsys.readouterr().out
    for v, why in ((v2, "does not match manifest.json"), (v3, "not trusted"),
                   (v4, "unsigned")):
        with pytest.raises(BundleError, match=why):
            check_signed(v, load_trusted(trusted))
        assert main(["verify", str(v), "--no-parity", "--trusted-keys", str(trusted)]) == 2
        assert why in capsys.readouterr().err

    app = create_app(Settings(repo=repo, warmup=False, trusted_keys=trusted))
    with serve_in_thread(app) as url:
        info = httpx.get(f"{url}/v1/models/{MODEL}").json()
        states = {v["version"]: (v["state"], v.get("reason") or "") for v in info["versions"]}
        assert states[1][0] == "ready" and info["default_version"] == 1
        for v, why in ((2, "does not match"), (3, "not trusted"), (4, "unsigned")):
            assert states[v][0] == "failed" and why in states[v][1], states[v]
        ok = httpx.post(f"{url}/v1/models/{MODEL}/classify", json={"texts": ["one two"]})
        assert ok.status_code == 200 and ok.json()["version"] == 1
    # without --trusted-keys the signature file is no stranger in the folder
    with serve_in_thread(create_app(Settings(repo=repo, warmup=False))) as url:
        versions = httpx.get(f"{url}/v1/models/{MODEL}").json()["versions"]
        assert {v["version"]: v["state"] for v in versions}[1] == "ready"


def test_a_trusted_keys_folder_without_keys_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no \\*.pub key"):
        load_trusted(tmp_path)
