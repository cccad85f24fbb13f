"""hw/spec.py is the one source: the Amaranth layouts, the register map's error codes and
the host side's aux byte image agree with it field for field."""

import numpy as np

from dnnfab.hw import spec
from dnnfab.hw.compute import aux_layout
from dnnfab.hw.isa import compute_insn_layout, dma_insn_layout
from dnnfab.hw.regmap import accelerator_regmap
from presets import CFG_8, CFG_SMALL


def test_instruction_layouts_follow_the_spec():
    for layout, fields in ((dma_insn_layout(), spec.HEADER + spec.DMA_FIELDS),
                           (compute_insn_layout(), spec.HEADER + spec.COMPUTE_FIELDS)):
        assert layout.size == spec.INSN_BITS == 256
        pos = 0
        for name, width in fields:
            f = layout[name]
            assert (f.offset, f.shape.width, f.shape.signed) == (pos, width, False), name
            pos += width


def test_field_limits():
    assert (spec.MAX_KERNEL, spec.MAX_STRIDE, spec.MAX_PAD, spec.MAX_SIDE, spec.MAX_CBP,
            spec.MAX_OUT_BLOCKS, spec.MAX_ROW_BEATS, spec.MAX_K_TILES) == \
        (15, 7, 15, 4095, 1023, 255, 65535, (1 << 14) - 1)
    c = spec.Compute(kh_n=spec.MAX_KERNEL, oh_n=spec.MAX_SIDE, cbp=spec.MAX_CBP, zx=-128, lo=-7)
    assert spec.decode(c.encode()) == c and len(c.to_bytes()) == spec.INSN_BYTES == 32
    ld = spec.Load(len0=spec.MAX_ROW_BEATS, target=spec.Target.AUX)
    assert spec.decode(int.from_bytes(ld.to_bytes(), "little")) == ld


def test_aux_lane_layout():
    for cfg in (CFG_8, CFG_SMALL):
        lay = aux_layout(cfg)
        assert lay.size == cfg.cols * spec.AUX_LANE_BITS
        lane = lay.elem_shape
        pos = 0
        for name, width, signed in spec.AUX_FIELDS:
            f = lane[name]
            assert (f.offset, f.shape.width, f.shape.signed) == (pos, width, signed), name
            pos += width
    dt = np.dtype(spec.AUX_DTYPE)
    assert dt.itemsize == spec.AUX_LANE_BYTES == 8
    assert [(n, dt[n].itemsize * 8, dt[n].kind == "i") for n in dt.names] == \
        [(n, w, s) for n, w, s in spec.AUX_FIELDS]
    assert [dt.fields[n][1] * 8 for n in dt.names] == [0, 32, 48, 56]


def test_codes():
    assert [int(o) for o in spec.Opcode] == [1, 2, 3]
    assert [int(t) for t in spec.Target] == [0, 1, 2, 3]
    assert spec.ERROR_CODES == {"NONE": 0, "AXI_READ": 1, "AXI_WRITE": 2, "ILLEGAL_INSN": 3,
                                "SP_RANGE": 4, "OUT_WINDOW": 5, "PROG_FETCH": 6}
    assert accelerator_regmap(CFG_8).to_dict()["constants"]["ERR"] == spec.ERROR_CODES
