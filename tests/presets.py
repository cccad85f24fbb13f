"""The accelerator configurations the tests share (import by name: tests/conftest.py puts
tests/ on sys.path, as pytest's importlib mode does not)."""

from dnnfab.hw.config import AcceleratorConfig

#: the default 8x8 array: 64 KiB scratchpads, 128-bit bus
CFG_8 = AcceleratorConfig(rows=8, cols=8)
#: a small 4x4 array with a 64-bit bus and small scratchpads (short RTL runs, many tiles)
CFG_SMALL = AcceleratorConfig(rows=4, cols=4, bus_bits=64, act_kib=8, wgt_kib=8, acc_kib=8,
                              out_kib=4, aux_kib=1)
