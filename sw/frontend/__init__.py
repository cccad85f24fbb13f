"""Layer 2: ONNX import and its passes (:mod:`.onnx_import`), QDQ export (:mod:`.export`).
Imports only :mod:`dnnfab.sw.ir.graph` of sw/ (docs/architecture.md)."""
