"""The hardware spec: every fact the host side needs about the accelerator, in pure Python.

No Amaranth import: the compiler, the fast model and a host program on a board's CPU read
the instruction set, the limits of its fields, the aux lane layout, the error codes and
the fixed pipeline latencies from here; hw/ builds its Amaranth layouts and its pipelines
from the same numbers (hw/isa.py, hw/controller.py, hw/regmap.py, hw/dma.py,
hw/compute.py, hw/postproc.py, hw/scratchpad.py, hw/systolic.py), and the RTL tests
assert the latencies against this module.

The instruction set: one field list, used by hardware and software.

Every instruction is 256 bits (32 bytes, little-endian in DRAM). Bits [2:0] hold the
opcode, bits [6:3] the dependency-token flags (the VTA scheme), the rest depends on the
opcode. Three engines run decoupled, each from its own queue:

=========  =========================================================================
LOAD       DMA read: DRAM -> scratchpad (activations, weights, aux = bias/requant)
COMPUTE    stream a conv/GEMM tile through the array, accumulate, requantize, write
           int8 results into the output scratchpad
STORE      DMA write: output scratchpad -> DRAM
=========  =========================================================================

Tokens (counting semaphores between neighbouring engines): LOAD <-> COMPUTE <-> STORE.
``pop_prev``/``pop_next`` wait for (and consume) a token from the previous/next engine in
the chain, ``push_prev``/``push_next`` give one when the instruction has completed. LOAD has
only a next (COMPUTE), STORE only a previous (COMPUTE). Opcode 0 and 4..7 are illegal
(so zeroed memory stops the machine with an error instead of doing something).

Descriptor fields (LOAD/STORE) follow :class:`dnnfab.hw.dma` (3-D strided, dense on the
scratchpad side). COMPUTE fields describe an implicit-im2col convolution tile, see
:class:`ComputeFields` and ``docs/accelerator.md``. The Amaranth layouts of these
fields are built in :mod:`dnnfab.hw.isa`.
"""

from dataclasses import dataclass, fields as dc_fields

from enum import IntEnum

INSN_BITS = 256
INSN_BYTES = INSN_BITS // 8


class Opcode(IntEnum):
    """Bits [2:0] of an instruction; 0 and 4..7 are illegal."""
    LOAD = 1
    COMPUTE = 2
    STORE = 3


class Target(IntEnum):
    """The DMA's scratchpad targets (LOAD ``target`` field; INSN is the controller's fetch)."""
    ACT = 0
    WGT = 1
    INSN = 2
    AUX = 3


#: the store direction has one source, the output scratchpad
TARGET_OUT = 0


class ErrorCode(IntEnum):
    """STATUS.ERROR_CODE and the DMA's error code (``DNNFAB_ERR_*`` in regs.h)."""
    NONE = 0
    AXI_READ = 1       #: an AXI read response (DMA load) was SLVERR or DECERR
    AXI_WRITE = 2      #: an AXI write response (DMA store) was SLVERR or DECERR
    ILLEGAL_INSN = 3   #: the controller decoded an instruction it does not know
    SP_RANGE = 4       #: an instruction addressed a scratchpad row out of range
    OUT_WINDOW = 5     #: a DMA store touched a byte outside [OUT_LO, OUT_HI); not issued
    PROG_FETCH = 6     #: fetching the instruction stream failed (AXI read error)


# plain ints for the HDL (an IntEnum member in an Amaranth expression would take the
# enum's shape instead of the constant's own width)
OP_LOAD, OP_COMPUTE, OP_STORE = int(Opcode.LOAD), int(Opcode.COMPUTE), int(Opcode.STORE)
OPCODES = {"LOAD": OP_LOAD, "COMPUTE": OP_COMPUTE, "STORE": OP_STORE}
TARGET_ACT, TARGET_WGT, TARGET_INSN, TARGET_AUX = (int(Target.ACT), int(Target.WGT),
                                                   int(Target.INSN), int(Target.AUX))
ERR_NONE, ERR_AXI_READ, ERR_AXI_WRITE, ERR_ILLEGAL_INSN, ERR_SP_RANGE, ERR_OUT_WINDOW, \
    ERR_PROG_FETCH = (int(e) for e in ErrorCode)
ERROR_CODES = {e.name: int(e) for e in ErrorCode}

HEADER = [("opcode", 3), ("pop_prev", 1), ("pop_next", 1), ("push_prev", 1), ("push_next", 1)]

DMA_FIELDS = [
    ("addr", 32), ("len0", 16), ("n1", 16), ("stride1", 32), ("n2", 16), ("stride2", 32),
    ("sp_addr", 16), ("target", 2),
]

COMPUTE_FIELDS = [
    ("acc_init", 1),      # 1: the first K tile starts from the bias; 0: add to the accumulator
    ("finalize", 1),      # 1: the last K tile requantizes and writes int8 outputs
    ("a_base", 16),       # activation scratchpad element (R int8) of input pixel (0, 0), block 0
    ("w_base", 16),       # weight scratchpad element (C int8) of this job's first weight row
    ("acc_base", 16),     # accumulator row of output pixel 0
    ("aux_addr", 16),     # aux scratchpad element with bias/m/n of the C output channels
    ("out_base", 16),     # output scratchpad element (C int8) of output pixel 0
    ("out_stride", 8),    # output elements between consecutive output pixels
    ("oh_n", 12), ("ow_n", 12),             # output tile height/width (pixels)
    ("kh_n", 4), ("kw_n", 4), ("cb_n", 10),  # kernel height/width, input-channel blocks of R
    ("hin", 12), ("win", 12),               # input tile height/width in the scratchpad
    ("cbp", 10),          # R-blocks per input pixel in the activation scratchpad layout
    ("sh", 3), ("sw", 3), ("dh", 3), ("dw", 3),
    ("pt", 4), ("pl", 4),  # top/left padding (bottom/right follow from hin/win)
    ("zx", 8), ("zy", 8), ("lo", 8), ("hi", 8),
]


FIELD_WIDTHS = {name: width for name, width in HEADER + DMA_FIELDS + COMPUTE_FIELDS}


def field_max(name):
    """Largest value of an (unsigned) instruction field."""
    return (1 << FIELD_WIDTHS[name]) - 1


# ---- limits the compiler checks (they follow from the field widths above)
MAX_KERNEL = field_max("kh_n")            # kh, kw <= 15
MAX_STRIDE = field_max("sh")              # stride and dilation <= 7
MAX_PAD = field_max("pt")                 # top/left padding <= 15
MAX_SIDE = field_max("oh_n")              # feature map height/width <= 4095 pixels
MAX_CBP = field_max("cbp")                # R-blocks per input pixel <= 1023
MAX_OUT_BLOCKS = field_max("out_stride")  # C-blocks per output pixel <= 255
MAX_ROW_BEATS = field_max("len0")         # bus beats in one DMA row <= 65535
#: width of the compute decoder's K-tile count (kh * kw * cb_n), hw/compute.py
KTILE_BITS = 14
MAX_K_TILES = (1 << KTILE_BITS) - 1

# ---- the aux lane: bias' (int32), m (uint16), n (uint8), reserved (uint8) per output
# channel, little-endian, one lane per array column
AUX_FIELDS = [("bias", 32, True), ("m", 16, False), ("n", 8, False), ("rsv", 8, False)]
AUX_LANE_BITS = sum(w for _, w, _ in AUX_FIELDS)     # 64
AUX_LANE_BYTES = AUX_LANE_BITS // 8
#: numpy dtype of one aux lane (the byte image the compiler writes and the fast model reads)
AUX_DTYPE = [("bias", "<i4"), ("m", "<u2"), ("n", "u1"), ("rsv", "u1")]

# ---- fixed latencies (cycles) of the RTL blocks
MUL_LATENCY = 2          #: registered multiplier (hw/pe.py)
RQ_LATENCY = 10          #: requantizer (hw/postproc.py)
RAM_READ_LATENCY = 2     #: registered RAM read (hw/scratchpad.py)
SP_READ_LATENCY = 5      #: scratchpad read: r_en -> data (hw/scratchpad.py)
FETCH_CHUNK = 8          #: instructions per controller fetch request (hw/controller.py)
QUEUE_DEPTH = 8          #: entries of each engine's instruction queue (hw/controller.py)
TOKEN_BITS = 8           #: width of each dependency-token counter (hw/controller.py)


def array_latency(rows, cols):
    """Cycles from an ``act`` transfer to the matching ``out`` beat of the systolic array
    (no stalls)."""
    return rows + cols + 3


def min_tile_rows(rows, cols):
    """Shortest tile (in act beats) that streams through the array back to back without a
    bubble."""
    return 2 * rows + cols + 1


# Pipeline constants of the whole accelerator as the fast model uses them; calibrated
# against RTL measurements (tests/cosim/test_accel_layers.py asserts the estimate within
# a tolerance).
START_LATENCY = 8        #: CTRL write -> first fetch request (registered CSR write, start, fetch decision + rd_cmd)
FETCH_LATENCY = 14       #: read command -> instructions in the queue (incl. the DMA's registered initial state)


def _pack(fields_, values):
    word, pos = 0, 0
    for name, width in fields_:
        v = int(values.get(name, 0))
        if name in ("zx", "zy", "lo", "hi") and v < 0:
            v &= 0xFF
        if v < 0 or v >= (1 << width):
            raise ValueError(f"instruction field {name}={values.get(name)} does not fit in {width} bits")
        word |= v << pos
        pos += width
    return word


def _unpack(fields_, word):
    out, pos = {}, 0
    for name, width in fields_:
        out[name] = (word >> pos) & ((1 << width) - 1)
        pos += width
    return out


@dataclass
class _Insn:
    pop_prev: int = 0
    pop_next: int = 0
    push_prev: int = 0
    push_next: int = 0

    def encode(self) -> int:
        vals = {f.name: getattr(self, f.name) for f in dc_fields(self)}
        vals["opcode"] = self.OPCODE
        return _pack(HEADER + self.FIELDS, vals)

    def to_bytes(self) -> bytes:
        return self.encode().to_bytes(INSN_BYTES, "little")


@dataclass
class _DmaInsn(_Insn):
    """A 3-D strided DMA descriptor: ``n2`` planes of ``n1`` rows of ``len0`` bus beats."""
    addr: int = 0
    len0: int = 1
    n1: int = 1
    stride1: int = 0
    n2: int = 1
    stride2: int = 0
    sp_addr: int = 0
    target: int = 0
    FIELDS = DMA_FIELDS

    @property
    def beats(self):
        return self.len0 * self.n1 * self.n2


@dataclass
class Load(_DmaInsn):
    """DRAM -> scratchpad ``target`` (TARGET_ACT/WGT/AUX), 3-D strided source."""
    OPCODE = OP_LOAD


@dataclass
class Store(_DmaInsn):
    """Output scratchpad -> DRAM, 3-D strided destination."""
    OPCODE = OP_STORE


@dataclass
class Compute(_Insn):
    """One convolution tile: all K tiles of C output channels over oh_n x ow_n pixels."""
    acc_init: int = 1
    finalize: int = 1
    a_base: int = 0
    w_base: int = 0
    acc_base: int = 0
    aux_addr: int = 0
    out_base: int = 0
    out_stride: int = 1
    oh_n: int = 1
    ow_n: int = 1
    kh_n: int = 1
    kw_n: int = 1
    cb_n: int = 1
    hin: int = 1
    win: int = 1
    cbp: int = 1
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    pt: int = 0
    pl: int = 0
    zx: int = 0
    zy: int = 0
    lo: int = -128
    hi: int = 127
    OPCODE = OP_COMPUTE
    FIELDS = COMPUTE_FIELDS

    @property
    def k_tiles(self):
        return self.kh_n * self.kw_n * self.cb_n

    @property
    def pixels(self):
        return self.oh_n * self.ow_n


def encode(insn) -> int:
    return insn.encode()


def decode(word: int):
    """Instruction object from its 256-bit encoding (raises ValueError if illegal)."""
    op = word & 7
    cls = {OP_LOAD: Load, OP_COMPUTE: Compute, OP_STORE: Store}.get(op)
    if cls is None:
        raise ValueError(f"illegal opcode {op}")
    vals = _unpack(HEADER + cls.FIELDS, word)
    vals.pop("opcode")
    for k in ("zx", "zy", "lo", "hi"):
        if k in vals and vals[k] >= 128:
            vals[k] -= 256
    return cls(**vals)
