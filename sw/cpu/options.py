"""Execution options of the host side, passed down explicitly (no process-wide switches).

One frozen :class:`Options` value travels from the entry points (``QuantizedNetwork.run``,
:func:`~dnnfab.sw.cpu.reference.run_reference`, :func:`~dnnfab.sw.runtime.network.run_network`)
down to the kernels, so several sessions and worker threads can run with different
settings at once. :meth:`Options.from_env` is the one place that reads the environment:
an entry point called without ``options`` uses it; everything below takes the value it is
given.

=====================  ======================  =============================================
field                  environment variable    meaning
=====================  ======================  =============================================
``threads``            ``DNNFAB_THREADS``      intra-op threads of the onnxruntime sessions
                                               (default min(2, CPU count))
``gemm_engine``        ``DNNFAB_GEMM_ENGINE``  ``"numpy"`` (float32 BLAS, K chunked at
                                               1024), ``"ort"`` (onnxruntime uint8 x uint8
                                               MatMulInteger) or ``"auto"`` (default)
``fast_plan``          ``DNNFAB_FAST_PLAN``    compiled :class:`FastPlan` executor (default
                                               on; ``0`` turns it off)
``numba``              ``DNNFAB_NUMBA``        fused numba kernels (default on; ``0`` turns
                                               them off; off as well where numba is missing)
``workers``            ``DNNFAB_WORKERS``      threads of the CPU worker pool
                                               (:class:`~dnnfab.sw.cpu.workers.CpuWorkers`;
                                               default None: the CPU's cores)
``pool``               ``DNNFAB_POOL``         how a whole-graph run of the workers uses its
                                               threads: ``"processes"`` (default:
                                               ``workers - 1`` helper processes beside the
                                               caller, one native helper whose onnxruntime
                                               sessions share onnxruntime's own thread pool,
                                               or the caller alone, whichever measured
                                               fastest; see procpool.py) or ``"threads"``
                                               (one process)
``net_plan``           ``DNNFAB_NET_PLAN``     a small network (at most
                                               ``netplan.PLAN_MAX_MACS`` MACs of conv, gemm,
                                               pool and reshape layers) runs as one prepared
                                               plan, one numba call per layer (default on;
                                               ``0`` turns it off: layer by layer)
=====================  ======================  =============================================

Every setting gives bit-identical results; they change only speed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

__all__ = ["Options", "GEMM_ENGINES"]

GEMM_ENGINES = ("numpy", "ort", "auto")
POOLS = ("threads", "processes")


def _default_threads():
    return min(2, os.cpu_count() or 1)


@dataclass(frozen=True)
class Options:
    """How the host side executes (see the module docstring)."""
    threads: int = field(default_factory=_default_threads)
    gemm_engine: str = "auto"
    fast_plan: bool = True
    numba: bool = True
    workers: int | None = None
    pool: str = "processes"
    net_plan: bool = True

    def __post_init__(self):
        if self.pool not in POOLS:
            raise ValueError(f"pool must be 'threads' or 'processes', got {self.pool!r}")
        if self.gemm_engine not in GEMM_ENGINES:
            raise ValueError("engine must be 'numpy', 'ort' or 'auto'")
        if int(self.threads) < 1:
            raise ValueError(f"threads must be at least 1, got {self.threads}")
        object.__setattr__(self, "threads", int(self.threads))
        object.__setattr__(self, "fast_plan", bool(self.fast_plan))
        object.__setattr__(self, "numba", bool(self.numba))
        object.__setattr__(self, "net_plan", bool(self.net_plan))
        if self.workers is not None:
            if int(self.workers) < 1:
                raise ValueError(f"workers must be at least 1, got {self.workers}")
            object.__setattr__(self, "workers", int(self.workers))

    @classmethod
    def from_env(cls, environ=None) -> "Options":
        """The defaults, as the environment sets them (``DNNFAB_THREADS``,
        ``DNNFAB_GEMM_ENGINE``, ``DNNFAB_FAST_PLAN``, ``DNNFAB_NUMBA``, ``DNNFAB_WORKERS``,
        ``DNNFAB_POOL``, ``DNNFAB_NET_PLAN``)."""
        env = os.environ if environ is None else environ
        kw = {}
        if env.get("DNNFAB_THREADS"):
            kw["threads"] = int(env["DNNFAB_THREADS"])
        if env.get("DNNFAB_WORKERS"):
            kw["workers"] = int(env["DNNFAB_WORKERS"])
        if env.get("DNNFAB_POOL"):
            kw["pool"] = env["DNNFAB_POOL"]
        return cls(gemm_engine=env.get("DNNFAB_GEMM_ENGINE", "auto"),
                   fast_plan=env.get("DNNFAB_FAST_PLAN", "1") != "0",
                   numba=env.get("DNNFAB_NUMBA", "1") != "0",
                   net_plan=env.get("DNNFAB_NET_PLAN", "1") != "0", **kw)

    def replace(self, **changes) -> "Options":
        """A copy with ``changes`` (e.g. ``opts.replace(gemm_engine="numpy")``)."""
        return replace(self, **changes)
