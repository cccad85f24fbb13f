"""The Amaranth layouts of the instruction set. The fields, opcodes and targets are the
pure-Python facts of :mod:`dnnfab.hw.spec` (re-exported here for the HDL modules); this
module only turns their field lists into :class:`amaranth.lib.data.StructLayout`\\ s."""

from amaranth.hdl import unsigned
from amaranth.lib import data

from .spec import (INSN_BITS, INSN_BYTES, OP_LOAD, OP_COMPUTE, OP_STORE, OPCODES, HEADER,
                   DMA_FIELDS, COMPUTE_FIELDS, TARGET_ACT, TARGET_WGT, TARGET_INSN, TARGET_AUX)

__all__ = ["INSN_BITS", "INSN_BYTES", "OP_LOAD", "OP_COMPUTE", "OP_STORE", "OPCODES",
           "HEADER", "DMA_FIELDS", "COMPUTE_FIELDS", "insn_layout", "dma_insn_layout",
           "compute_insn_layout", "TARGET_ACT", "TARGET_WGT", "TARGET_INSN", "TARGET_AUX"]


def _layout(fields_):
    layout = {}
    used = 0
    for name, width in fields_:
        layout[name] = unsigned(width)
        used += width
    assert used <= INSN_BITS, used
    if used < INSN_BITS:
        layout["_pad"] = unsigned(INSN_BITS - used)
    return data.StructLayout(layout)


def dma_insn_layout():
    return _layout(HEADER + DMA_FIELDS)


def compute_insn_layout():
    return _layout(HEADER + COMPUTE_FIELDS)


def insn_layout():
    return _layout(HEADER)
