"""Signed bundles: an ed25519 signature over a bundle's manifest.json, so that its hashes say
who published it, not only that the files are the ones it lists.

`manifest.json` holds the sha256 of every other file of the bundle (and of itself), so one
signature over its exact bytes covers the whole bundle. The signature lies beside it in
`manifest.sig` (JSON: `algorithm`, `key_id`, `signature` in base64), the one file besides
the manifest that the manifest does not list. `seqserve sign --new-key DIR` makes a key pair
(`NAME.key`, mode 0600, and `NAME.pub`, both PEM); `seqserve sign BUNDLE --key NAME.key`
signs; `seqserve serve --trusted-keys DIR` (and `seqserve verify --trusted-keys DIR`) refuses
any bundle without a valid signature by one of the `*.pub` keys in DIR. A key's id is the
first 16 hex digits of the sha256 of its raw public bytes. Torch-free: the server checks
signatures when it loads a bundle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

from seqserve.export.manifest import MANIFEST_FILE, SIGNATURE_FILE, read_manifest_bytes
from seqserve.models.errors import BundleError, UserError

ALGORITHM = "ed25519"


def key_id(public_raw: bytes) -> str:
    """The id a signature names its key by."""
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _raw(public_key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def new_key(folder: str | os.PathLike[str], name: str = "seqserve") -> tuple[Path, Path]:
    """Write a new key pair: `folder/NAME.key` (private, PEM, mode 0600) and `NAME.pub`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    private, public = out / f"{name}.key", out / f"{name}.pub"
    if private.exists() or public.exists():
        raise UserError(f"{private} or {public} exists: choose another --name or folder")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def sign_bundle(bundle: str | os.PathLike[str], private_key: str | os.PathLike[str]) -> Path:
    """Sign `bundle/manifest.json` with the PEM private key; write `manifest.sig`."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    root = Path(bundle)
    manifest = root / MANIFEST_FILE
    if not manifest.is_file():
        raise UserError(f"{root}: no manifest.json: not a bundle folder")
    try:
        key = serialization.load_pem_private_key(Path(private_key).read_bytes(), None)
    except (OSError, ValueError, TypeError) as exc:
        raise UserError(f"{private_key}: not a PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise UserError(f"{private_key}: an {ALGORITHM} key is needed")
    signature = key.sign(manifest.read_bytes())
    out = root / SIGNATURE_FILE
    out.write_text(json.dumps({"algorithm": ALGORITHM, "key_id": key_id(_raw(key.public_key())),
                               "signature": base64.b64encode(signature).decode()}) + "\n")
    return out


def load_trusted(folder: str | os.PathLike[str]) -> dict[str, object]:
    """The public keys (`*.pub`, PEM) of a trusted-keys folder, by key id; UserError when the
    folder holds none (a server told to trust nobody would refuse every bundle)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    root = Path(folder)
    keys: dict[str, object] = {}
    for path in sorted(root.glob("*.pub")) if root.is_dir() else []:
        try:
            key = serialization.load_pem_public_key(path.read_bytes())
        except ValueError as exc:
            raise UserError(f"{path}: not a PEM public key ({exc})") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise UserError(f"{path}: an {ALGORITHM} public key is needed")
        keys[key_id(_raw(key))] = key
    if not keys:
        raise UserError(f"{root}: no *.pub key to trust (trusted keys: a folder of "
                        f"{ALGORITHM} public keys in PEM, as `seqserve sign --new-key` writes)")
    return keys


def check_signed(bundle: str | os.PathLike[str], trusted: dict[str, object]) -> str:
    """The id of the trusted key whose signature over `bundle/manifest.json` verifies;
    BundleError naming what is wrong (unsigned, unknown key, bad signature)."""
    from cryptography.exceptions import InvalidSignature

    root = Path(bundle)
    sig_path = root / SIGNATURE_FILE
    if not sig_path.is_file():
        raise BundleError(f"{root.name}: unsigned ({SIGNATURE_FILE} is missing) and the "
                          "server trusts signed bundles only (--trusted-keys)")
    try:
        sig = json.loads(sig_path.read_text(encoding="utf-8"))
        kid, signature = str(sig["key_id"]), base64.b64decode(sig["signature"], validate=True)
        if sig.get("algorithm") != ALGORITHM:
            raise ValueError(f"algorithm {sig.get('algorithm')!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{sig_path.name}: not a signature file ({exc})") from exc
    key = trusted.get(kid)
    if key is None:
        raise BundleError(f"{sig_path.name}: signed by key {kid}, which is not trusted")
    try:
        key.verify(signature, read_manifest_bytes(root))  # type: ignore[attr-defined]
    except InvalidSignature as exc:
        raise BundleError(f"{sig_path.name}: the signature by key {kid} does not match "
                          "manifest.json (changed after signing?)") from exc
    return kid
