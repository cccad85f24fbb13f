"""Layer 4: the golden integer kernels, the literal contract (:mod:`.golden`), slow on
purpose. Imports ir, frontend and quant of sw/ (docs/architecture.md)."""
