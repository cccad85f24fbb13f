"""Layer 1 of the host side: the float graph, the quantized graph as plain data, shapes and
the contract's integer arithmetic (docs/architecture.md). Imports nothing else of sw/."""
