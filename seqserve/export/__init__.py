"""Eager model -> artifact bundle (ONNX + TorchScript), parity checks, manifest.

Modules: `manifest` (torch-free: read/write/verify/list bundles; the server imports it),
`contract` (torch-free: the task table, graph signatures, the manifest schema and the checks
every reader applies), `graphs` (wrapper modules around the eager entry points), `formats`
(ONNX/TorchScript writers and the symbolic-dims check), `runners`, `compare` and `parity`
(parity and batch-invariance grid), `writer` (the one bundle writer, used by `bundle` and
`pack`), `bundle` (`export_run`), `verify` (`verify_bundle`), `summary` (printed reports),
`pack` (models written outside seqserve -> bundles).
Importing the package itself imports nothing heavy.
"""
