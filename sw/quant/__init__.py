"""Layer 3: calibration and post-training quantization, float graph -> quantized graph
(:mod:`.ptq`). Imports ir and frontend of sw/ (docs/architecture.md)."""
