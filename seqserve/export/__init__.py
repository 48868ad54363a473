"""Eager model -> artifact bundle (ONNX + TorchScript), parity checks, manifest.

Modules: `manifest` (torch-free: read/write/verify/list bundles; the server imports it),
`graphs` (wrapper modules and contract signatures), `formats` (ONNX/TorchScript writers and
the symbolic-dims check), `runners`, `compare` and `parity` (parity and batch-invariance
grid), `bundle` (`export_run`), `verify` (`verify_bundle`), `summary` (printed reports).
Importing the package itself imports nothing heavy.
"""
