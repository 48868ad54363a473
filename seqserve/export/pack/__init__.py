"""`seqserve pack`: models written outside seqserve -> verified bundles (docs/bundle-format.md).

Modules: `onnx_compose` (wrap a user's ONNX graph into the contract by composing ONNX
graphs, no torch), `torch_wrap` (the same wrapping around a PyTorch module), `bundle`
(`pack_bundle`: write, check, publish), `files` (the CLI's path: ONNX / TorchScript files
in), `api` (the Python API: nn.Modules in; public as `seqserve.pack`).
"""
