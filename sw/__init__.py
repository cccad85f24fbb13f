"""dnnfab.sw: the host side, as layered subpackages (docs/architecture.md).

ir -> frontend -> quant -> ref -> cpu -> compiler -> (metrics) -> driver -> (sched) ->
runtime: each imports only from the ones before it; tests/test_architecture.py checks it.
"""
