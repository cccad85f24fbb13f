"""Layer 5: fast exact CPU execution of the quantized graph -- numba kernels
(:mod:`.kernels`), GEMM engines, the compiled plan and the network executor
(:mod:`.reference`), the execution options (:mod:`.options`), the exact engines and their
selector (:mod:`.engines`), the multithreaded worker pool (:mod:`.workers`) and the CPU
latency profile (:mod:`.profile`); docs/cpu.md. Imports the layers above it (ir ... ref)
of sw/ (docs/architecture.md)."""

from .engines import CpuFeatures, EngineChoice, select_engine
from .options import Options
from .profile import CpuProfile, layer_signature
from .workers import CpuTaskError, CpuWorkers

__all__ = ["CpuWorkers", "CpuTaskError", "CpuProfile", "layer_signature", "CpuFeatures",
           "EngineChoice", "select_engine", "Options"]
