"""Layer 5: fast exact CPU execution of the quantized graph -- numba kernels
(:mod:`.kernels`), GEMM engines, the compiled plan and the network executor
(:mod:`.reference`), the execution options (:mod:`.options`). Imports the layers above it
(ir ... ref) of sw/ (docs/architecture.md)."""
