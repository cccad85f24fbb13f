"""The accelerator's register map and the error codes the hardware reports.

One description (:func:`accelerator_regmap`) builds the AXI4-Lite register bank
(:class:`dnnfab.hw.csr.CSRBank`), the ``regmap`` JSON of the manifest and ``regs.h``.

Layout (byte offsets; every register is one 32-bit word):

====== ============== ====== ===========================================================
offset name           access contents
====== ============== ====== ===========================================================
0x000  ID             const  magic 0x444E4E46 ("DNNF")
0x004  VERSION        const  MAJOR[23:16] MINOR[15:8] PATCH[7:0] of the register map
0x008  CONFIG0        const  ROWS[7:0] COLS[15:8] BUS_BYTES[23:16] INPUT_BITS[27:24]
                             WEIGHT_BITS[31:28]
0x00C  CONFIG1        const  ACT_KIB[15:0] WGT_KIB[31:16]
0x010  CONFIG2        const  ACC_KIB[15:0] OUT_KIB[31:16]
0x014  CONFIG3        const  ACC_BITS[7:0] ADDR_BITS[15:8] MAX_BURST[24:16] ID_BITS[31:28]
0x020  CTRL           pulse  START[0] SOFT_RESET[1] CLEAR_ERROR[2]
0x024  STATUS         ro     BUSY[0] DONE[1] ERROR[2] ERROR_CODE[15:8]
0x028  ERROR_INFO     ro     faulting byte address (DMA) or program index (illegal insn)
0x030  IRQ_ENABLE     rw     DONE[0] ERROR[1]
0x034  IRQ_STATUS     w1c    DONE[0] ERROR[1]
0x040  PROG_BASE      rw     byte address of the instruction stream
0x044  PROG_LEN       rw     instruction count
0x048  OUT_LO         rw     DMA write window: lowest byte address (inclusive)
0x04C  OUT_HI         rw     DMA write window: end byte address (exclusive)
0x080+ <COUNTER>_LO/HI ro    64-bit performance counters, 8 bytes each (see COUNTERS)
====== ============== ====== ===========================================================

CONFIG0 stores the bit widths modulo 16 (16-bit inputs read as 0); the full config is in
the manifest and the header.
"""

from .regdesc import Register, RegisterMap, Field
from .config import AcceleratorConfig

__all__ = ["accelerator_regmap", "ERR_NONE", "ERR_AXI_READ", "ERR_AXI_WRITE", "ERR_ILLEGAL_INSN",
           "ERR_SP_RANGE", "ERR_OUT_WINDOW", "ERR_PROG_FETCH", "ERROR_CODES", "COUNTERS",
           "ID_MAGIC", "REGMAP_VERSION"]

# -- error codes (STATUS.ERROR_CODE, DMA.error_code): ErrorCode in hw/spec.py ----------
from .spec import (ERR_NONE, ERR_AXI_READ, ERR_AXI_WRITE, ERR_ILLEGAL_INSN, ERR_SP_RANGE,  # noqa: E402
                   ERR_OUT_WINDOW, ERR_PROG_FETCH, ERROR_CODES)

ID_MAGIC = 0x444E4E46          # "DNNF"
REGMAP_VERSION = (0, 1, 0)     # major, minor, patch

#: 64-bit performance counters, in register order: name -> description.
COUNTERS = {
    "CYCLES": "cycles from START to DONE",
    "BUSY_CYCLES": "cycles the systolic array held valid data",
    "MACS": "multiply-accumulates performed",
    "DMA_RD_BYTES": "bytes read by the DMA (beats * bus bytes)",
    "DMA_WR_BYTES": "bytes written by the DMA (beats * bus bytes)",
    "STALL_CYCLES": "cycles compute waited on a dependency or data",
    "INSNS": "instructions retired",
}
COUNTER_BASE = 0x080


def _config_words(cfg: AcceleratorConfig):
    c0 = ((cfg.rows & 0xFF) | (cfg.cols & 0xFF) << 8 | (cfg.bus_bytes & 0xFF) << 16
          | (cfg.input_bits & 0xF) << 24 | (cfg.weight_bits & 0xF) << 28)
    c1 = (cfg.act_kib & 0xFFFF) | (cfg.wgt_kib & 0xFFFF) << 16
    c2 = (cfg.acc_kib & 0xFFFF) | (cfg.out_kib & 0xFFFF) << 16
    c3 = ((cfg.acc_bits & 0xFF) | (cfg.addr_bits & 0xFF) << 8 | (cfg.max_burst & 0x1FF) << 16
          | (cfg.id_bits & 0xF) << 28)
    return c0, c1, c2, c3


def accelerator_regmap(cfg: AcceleratorConfig) -> RegisterMap:
    """The accelerator's register map for ``cfg`` (CONFIG words carry its values)."""
    c0, c1, c2, c3 = _config_words(cfg)
    major, minor, patch = REGMAP_VERSION
    F = Field
    regs = [
        Register("ID", 0x000, "const", reset=ID_MAGIC, doc="magic 0x444E4E46 ('DNNF')"),
        Register("VERSION", 0x004, "const", reset=(major << 16) | (minor << 8) | patch,
                 fields=(F("PATCH", 0, 8), F("MINOR", 8, 8), F("MAJOR", 16, 8)),
                 doc="register map version"),
        Register("CONFIG0", 0x008, "const", reset=c0,
                 fields=(F("ROWS", 0, 8), F("COLS", 8, 8), F("BUS_BYTES", 16, 8),
                         F("INPUT_BITS", 24, 4), F("WEIGHT_BITS", 28, 4)),
                 doc="array shape, bus width, operand widths (mod 16)"),
        Register("CONFIG1", 0x00C, "const", reset=c1,
                 fields=(F("ACT_KIB", 0, 16), F("WGT_KIB", 16, 16)),
                 doc="activation and weight scratchpad sizes in KiB"),
        Register("CONFIG2", 0x010, "const", reset=c2,
                 fields=(F("ACC_KIB", 0, 16), F("OUT_KIB", 16, 16)),
                 doc="accumulator and output scratchpad sizes in KiB"),
        Register("CONFIG3", 0x014, "const", reset=c3,
                 fields=(F("ACC_BITS", 0, 8), F("ADDR_BITS", 8, 8), F("MAX_BURST", 16, 9),
                         F("ID_BITS", 28, 4)),
                 doc="accumulator width, AXI address width, longest burst, AXI ID width (mod 16)"),
        Register("CTRL", 0x020, "pulse", width=3,
                 fields=(F("START", 0, 1, "start the program at PROG_BASE"),
                         F("SOFT_RESET", 1, 1, "reset the datapath (not the registers)"),
                         F("CLEAR_ERROR", 2, 1, "clear STATUS.ERROR and ERROR_CODE")),
                 doc="write-only strobes"),
        Register("STATUS", 0x024, "ro", width=16,
                 fields=(F("BUSY", 0, 1), F("DONE", 1, 1), F("ERROR", 2, 1), F("ERROR_CODE", 8, 8)),
                 doc="run state; ERROR_CODE is one of DNNFAB_ERR_*"),
        Register("ERROR_INFO", 0x028, "ro",
                 doc="faulting byte address (DMA errors) or the illegal instruction's program index "
                     "(controller errors)"),
        Register("IRQ_ENABLE", 0x030, "rw", width=2,
                 fields=(F("DONE", 0, 1), F("ERROR", 1, 1)), doc="interrupt enables"),
        Register("IRQ_STATUS", 0x034, "w1c", width=2,
                 fields=(F("DONE", 0, 1), F("ERROR", 1, 1)), doc="interrupt causes; write 1 to clear"),
        Register("PROG_BASE", 0x040, "rw", doc="byte address of the instruction stream"),
        Register("PROG_LEN", 0x044, "rw", doc="number of instructions"),
        Register("OUT_LO", 0x048, "rw", doc="DMA write window start (inclusive byte address)"),
        Register("OUT_HI", 0x04C, "rw", doc="DMA write window end (exclusive byte address)"),
    ]
    for i, (name, doc) in enumerate(COUNTERS.items()):
        off = COUNTER_BASE + 8 * i
        regs.append(Register(f"{name}_LO", off, "ro", latch=f"{name}_HI",
                             doc=f"{doc}, bits [31:0]; reading latches {name}_HI"))
        regs.append(Register(f"{name}_HI", off + 4, "ro",
                             doc=f"{doc}, bits [63:32] as latched by the last {name}_LO read"))
    return RegisterMap(regs, name="dnnfab_regs",
                       constants={"ERR": ERROR_CODES, "ID": {"MAGIC": ID_MAGIC}})
