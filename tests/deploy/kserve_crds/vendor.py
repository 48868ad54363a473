"""Regenerates the KServe schemas of this folder from a KServe git checkout.

    python tests/deploy/kserve_crds/vendor.py KSERVE_GIT_DIR [REF]      (REF default v0.20.0)

Reads config/crd/full/serving.kserve.io_{servingruntimes,inferenceservices}.yaml at REF, keeps
each CRD's openAPIV3Schema of its served version, drops descriptions and `status` (set by the
controller, never in a manifest), and for the InferenceService only `spec.predictor` of its
components (the 2 MB CRD repeats a full pod spec for canary, explainer and transformer, which
the manifests here do not use; a manifest using them fails validation: strict checking rejects
what the schema no longer declares). Writes NAME.schema.json and source.json (ref, commit,
paths, sha256 of each source file).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CRDS = {"servingruntime": "config/crd/full/serving.kserve.io_servingruntimes.yaml",
        "inferenceservice": "config/crd/full/serving.kserve.io_inferenceservices.yaml"}
ISVC_COMPONENTS_DROPPED = ("canary", "explainer", "transformer")


def strip_descriptions(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_descriptions(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [strip_descriptions(v) for v in node]
    return node


def main(git_dir: str, ref: str) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", git_dir, *args], capture_output=True, text=True,
                              check=True).stdout

    commit = git("rev-parse", f"{ref}^{{commit}}").strip()
    source: dict[str, Any] = {"repository": "https://github.com/kserve/kserve", "ref": ref,
                              "commit": commit, "files": {}}
    for name, path in CRDS.items():
        text = git("show", f"{commit}:{path}")
        crd = yaml.safe_load(text)
        (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
        schema = strip_descriptions(version["schema"]["openAPIV3Schema"])
        schema["properties"].pop("status", None)
        if name == "inferenceservice":
            for component in ISVC_COMPONENTS_DROPPED:
                schema["properties"]["spec"]["properties"].pop(component)
        schema["x-seqserve-source"] = {
            "apiVersion": f"{crd['spec']['group']}/{version['name']}",
            "kind": crd["spec"]["names"]["kind"]}
        (HERE / f"{name}.schema.json").write_text(
            json.dumps(schema, sort_keys=True, separators=(",", ":")) + "\n")
        source["files"][path] = {"sha256": hashlib.sha256(text.encode()).hexdigest(),
                                 "schema": f"{name}.schema.json",
                                 "version": version["name"]}
    (HERE / "source.json").write_text(json.dumps(source, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "v0.20.0")
