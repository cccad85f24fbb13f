"""Analytical resource estimate, fit check and auto-sizing (milliseconds, no tools).

:func:`estimate` predicts LUTs, FFs, DSPs and block RAMs of a configuration on an FPGA
family from the structure of the generated hardware -- it counts what yosys will infer,
block by block, instead of scaling a reference design:

* **systolic array** (hw/systolic.py, hw/pe.py): per PE the activation, two weight
  registers (shadow/active), the product register and its copy in the fabric
  (``prod_q``); the partial-sum register has the
  exact width of its row's sum (:func:`dnnfab.hw.systolic.psum_bits`: ``P = in+w``
  bits in row 0, ``P+1`` in rows 1-2, ... 19 bits for 8 int8 products); the ``first``
  flags of all PEs with equal delay merge into ``R+C-1`` registers; skew
  ``in * R(R+1)/2``, deskew ``acc * C(C-1)/2``, valid/tag lines ``(R+C+3)(1+tag)``.
  One hard multiplier per PE (8x8 fits MULT18X18D, SB_MAC16 and DSP48E1). On 7-series,
  yosys packs the product register, the partial-sum adder and its register into the
  DSP48E1 (fitted separately). Adders are carry chains: ECP5 CCU2C (2 LUT4 each), iCE40
  SB_CARRY + one LUT per bit.
* **requantizer** (hw/postproc.py): per output lane a signed 32 x unsigned 16 multiply
  (2 multipliers on every family) plus the rounding adder, 49-bit arithmetic shifter and
  clamp (measured per lane).
* **memories** (amaranth.lib.memory): block RAM count = the cheapest geometry of the
  family's block (ECP5 DP16KD 16Kx1 .. 512x36 with 9-bit byte enables; iCE40 4 Kbit
  256x16 .. 2048x2; 7-series RAMB18 in 36 Kbit units), split at the write granularity.
* **DMA, CSR, controller and glue**: a per-family constant plus a bus-width term
  (calibrated against the synthesized accelerator, see docs/boards.md).

The tolerance of each figure against real synthesis is asserted in
tests/boards/test_fit.py and stated in docs/boards.md (DSP exact; FF exact for the
array on ECP5/iCE40; LUT and BRAM within :data:`TOLERANCE`).

:func:`check_fit` raises a :class:`~dnnfab.errors.FitError` naming the resource, the need
and the budget; :func:`autosize` picks the largest power-of-two array (and scratchpad
sizes) that fits.
"""

from contextlib import contextmanager
from contextvars import ContextVar
import math

from . import get_board, Board
from ..errors import FitError, ConfigError
from ..hw.config import AcceleratorConfig
from ..hw.scratchpad import dp16kd_blocks
from ..hw.systolic import psum_bits

__all__ = ["estimate", "check_fit", "autosize", "fit_report", "max_array", "TOLERANCE",
           "UTILISATION_LIMIT", "target_top", "memory_blocks"]

#: Relative tolerance of the estimate against yosys/nextpnr, per resource (asserted in tests).
TOLERANCE = {"dsp": 0.0, "ff": 0.10, "lut": 0.20, "bram": 0.15}

#: Share of each resource a design may use and still be called a fit. LUTs keep 15%
#: headroom: beyond that nextpnr's placement degrades Fmax and routing may fail.
UTILISATION_LIMIT = {"lut": 0.85, "ff": 0.90, "dsp": 1.0, "bram": 1.0, "spram": 1.0}

_PRIMITIVE = {
    "ecp5": {"dsp": "MULT18X18D", "bram": "DP16KD (18 Kbit)", "lut": "LUT4", "ff": "FFs"},
    "ice40": {"dsp": "SB_MAC16", "bram": "SB_RAM40_4K (4 Kbit)", "lut": "logic cells",
              "ff": "FFs", "spram": "SB_SPRAM256KA"},
    "xc7": {"dsp": "DSP48E1", "bram": "RAMB36E1 (36 Kbit)", "lut": "LUT6", "ff": "FFs"},
}

#: Which top level the fit check sizes when the caller does not say (see :func:`target_top`).
_TOP = ContextVar("dnnfab_fit_top", default="accelerator")


@contextmanager
def target_top(top):
    """Within this block, :func:`check_fit` / :func:`autosize` default to ``top``.

    ``dnnfab synth --top array`` wraps :func:`dnnfab.gencli.config_from_args` in it, so
    the board check there sizes the array rather than the whole accelerator.
    """
    tok = _TOP.set(top)
    try:
        yield
    finally:
        _TOP.reset(tok)


def _clog2(n):
    """Bits of a signal of ``range(n)`` (Amaranth's width)."""
    return max(0, (n - 1).bit_length())


def _mults(family, a_bits, b_bits):
    """Hard multipliers for one a x b multiply (signed widths including the sign bit)."""
    if family == "ecp5":
        return math.ceil(a_bits / 18) * math.ceil(b_bits / 18)
    if family == "ice40":
        return math.ceil(a_bits / 16) * math.ceil(b_bits / 16)
    return min(math.ceil(a_bits / 25) * math.ceil(b_bits / 18),
               math.ceil(a_bits / 18) * math.ceil(b_bits / 25))


# -- block estimates ------------------------------------------------------------------------
def _array(cfg: AcceleratorConfig, family, tag_bits):
    R, C = cfg.rows, cfg.cols
    I, W, A = cfg.input_bits, cfg.weight_bits, cfg.acc_bits
    P = I + W
    e = [psum_bits(cfg, r + 1) for r in range(R)]      # partial-sum width of each row
    L = R + C + 3
    ctrl_ff = 2 + _clog2(R + C + 1) + _clog2(R)   # shadow_full, registered wgt.ready, drain, wrow
    common_ff = (I * R * (R + 1) // 2          # skew
                 + (R + C - 1)                 # merged `first` flags
                 + e[-1] * C * (C - 1) // 2    # deskew
                 + L * (1 + tag_bits)          # valid / tag lines
                 + C * W + R                   # registered weight row, per-row write enables
                 + ctrl_ff)
    dsp = R * C * _mults(family, I, W)
    if family in ("ecp5", "ice40"):
        ff = common_ff + R * C * (I + 2 * W + P) + C * sum(e)
        # the product and active-weight registers live inside the multiplier block: on
        # ECP5 the MULT18X18D registers of hw/pe.py (which also registers its own A input:
        # the last column's a_out is then unused); on iCE40 yosys packs them into the
        # SB_MAC16 since they have no reset (``dreg``; measured 2x2: 209 FF + harness)
        ff -= R * C * (P + W) + R * I
        # the product once more in the fabric (hw/pe.py ``prod_q``; not packed on the
        # iCE40 either: measured 2x2, 309 FF in yosys)
        ff += R * C * P
        # partial-sum adders (rows 1..R-1), each as wide as its row's sum
        add_bits = C * sum(e[1:])
        if family == "ecp5":
            lut = 2 * C * sum(math.ceil(b / 2) for b in e[1:])
            lut += 25 + 2 * (R + C) + 2 * R * C // 8
            lut += 4 * C * (R - 1)   # nextpnr adds carry feed-in/out cells to each chain
        else:
            lut = add_bits + 15 + 2 * (R + C) + R * C
    else:  # xc7: product/psum registers and adders live in the DSP48E1 cascade
        # fitted on 2x2..8x8: per PE the shadow weight plus the share of activation
        # registers not absorbed as DSP input registers
        ff = common_ff + R * C * (W + (I - (2 * I) // C if C >= 2 else 0))
        # + hw/pe.py's ``prod_q``: yosys puts most of it into the DSP48E1 (its M/P
        # registers); measured 173 / 564 FF at 2x2 / 4x4, the estimate says 171 / 562
        ff += 2 * R * C
        lut = 8 + 2 * (R + C)
    return {"lut": lut, "ff": ff, "dsp": dsp}


#: Measured cost of one requantizer lane (hw/postproc.py), beyond its multipliers.
#: ECP5 FF refitted after pipelining the requantizer and accumulator (8x8 accelerator,
#: 14529 FFs measured 2026-11-29), +42 for the per-lane copies of the clamp scalars
#: (``dup_reg``, ECP5 only); iCE40/xc7 still carry the first-pass figures.
_RQ_LANE = {"ecp5": {"lut": 627, "ff": 578}, "ice40": {"lut": 533, "ff": 249},
            "xc7": {"lut": 372, "ff": 218}}

#: Block RAM geometries (depth, width, byte-enable slot width or 0).
_BRAM_GEOM = {
    "ecp5": [(16384, 1, 0), (8192, 2, 0), (4096, 4, 0), (2048, 9, 0), (1024, 18, 9), (512, 36, 9)],
    "ice40": [(2048, 2, 0), (1024, 4, 0), (512, 8, 0), (256, 16, 1)],
    # RAMB18E1 halves, counted as 0.5 RAMB36E1 below
    "xc7": [(16384, 1, 0), (8192, 2, 0), (4096, 4, 0), (2048, 9, 0), (1024, 18, 9), (512, 36, 9)],
}


def memory_blocks(family, width, depth, granularity=None):
    """Block RAMs for a ``depth`` x ``width`` memory with one write and one read port.

    ``granularity`` is the write-enable granularity in bits (None: whole row).
    """
    g = granularity if granularity and granularity < width else width
    groups = math.ceil(width / g)
    best = None
    for d, w, be in _BRAM_GEOM[family]:
        if be:
            slots = groups * math.ceil(g / be)
            per_block = w // be
            n = math.ceil(slots / per_block)
        else:
            n = groups * math.ceil(g / w)
        n *= math.ceil(depth / d)
        best = n if best is None else min(best, n)
    if family == "xc7":
        return best / 2
    return best


def _scratchpads(cfg: AcceleratorConfig, family):
    """(block RAMs, LUT, FF) of the scratchpads and the accumulator memory."""
    bus = cfg.bus_bits
    mems = [  # (name, write unit, read unit)
        ("act_kib", bus, cfg.rows * cfg.input_bits),
        ("wgt_kib", bus, cfg.cols * cfg.weight_bits),
        ("out_kib", cfg.cols * cfg.input_bits, bus),
        ("aux_kib", bus, cfg.cols * 64),
    ]
    bram = lut = ff = 0
    for name, wu, ru in mems:
        if not hasattr(cfg, name):
            continue
        row = max(wu, ru)
        depth = (getattr(cfg, name) * 8192) // row
        bram += _ram_blocks(family, row, depth, wu if wu < row else None)
        lut += 2 * wu + (ru * _clog2(row // ru) if ru < row else 0) + 30
        # request registers (write unit, both addresses, lane enables, oob), the read
        # lane's trip through the RAM and the read-data register (hw/scratchpad.py); the
        # DMA-side write registers of act/wgt/aux hold the same bits and yosys merges them
        # (counted in the glue)
        ff += ((wu if name == "out_kib" else 0) + 2 * _clog2(depth) + row // wu
               + 3 * _clog2(row // ru) + 3 + ru)
    acc_depth = cfg.sp_depth("acc_kib")
    bram += _ram_blocks(family, cfg.cols * cfg.acc_bits, acc_depth)
    return bram, lut, ff


def _ram_blocks(family, width, depth, granularity=None):
    """Block RAMs of one :class:`~dnnfab.hw.scratchpad.RegisteredRAM`: on ECP5 it
    instantiates its DP16KDs itself (exact count), elsewhere yosys maps a memory."""
    if family == "ecp5" and depth <= 1 << 14:
        return dp16kd_blocks(width, depth, granularity)
    return memory_blocks(family, width, depth, granularity)


#: DMA + CSR + controller + compute-engine control and FIFOs, per family:
#: (lut, ff, lut per bus bit, ff per bus bit, lut per lane, ff per lane, dsp), where a
#: "lane" is (rows + cols) / 2. Fitted to yosys synthesis of hw/top.py at 4x4 and 8x8
#: (bus 128); the DSPs are the compute engine's address multipliers. See docs/boards.md.
_GLUE = {
    # FF terms refitted 2026-11-30 to yosys counts of 4x4 (bus 64 and 128) and 8x8 (bus
    # 128) after the scratchpad/feeder pipelining: 10541, 10597, 16806; 10 DSPs (decode).
    # Constant +1073 after the fifth timing round (registered CSR writes, controller
    # copies, feeder edge twins and job register, status copies): 4x4 12138, 8x8 18021.
    # Constant +152 after the sixth (credit thermometers, per-lane addend selects, fault
    # and busy copies, back-end job register, fetch flags): 8x8 19353 at 4f643db
    "ecp5": (5362, 7590, 6, 0.72, 70, 238, 10),
    "ice40": (5362, 3384, 6, 6, 70, 143, 14),
    "xc7": (1925, 2333, 4, 6, 297, 220, 13),
}


_PNR_LUT_FACTOR = {"ecp5": 1.15}


def estimate(cfg: AcceleratorConfig, board, top=None):
    """Estimated ``{"lut", "ff", "dsp", "bram"[, "spram"]}`` of ``top`` on ``board``'s family.

    ``top`` is ``"array"`` (the bare systolic array, as ``dnnfab generate --top array``
    builds it, with an 8-bit tag) or ``"accelerator"`` (default).
    """
    board = get_board(board)
    fam = board.family
    top = top or _TOP.get()
    if top == "array":
        est = _array(cfg, fam, tag_bits=8)
        est["bram"] = 0
    elif top == "accelerator":
        est = _array(cfg, fam, tag_bits=0)
        C = cfg.cols
        rq = _RQ_LANE[fam]
        est["dsp"] += C * _mults(fam, cfg.acc_bits, 17)
        est["lut"] += C * rq["lut"]
        est["ff"] += C * rq["ff"]
        est["ff"] += C * psum_bits(cfg, cfg.rows) + 2   # back end's input register, feeder pulses
        bram, lut, ff = _scratchpads(cfg, fam)
        gl, gf, gl_bus, gf_bus, gl_lane, gf_lane, gdsp = _GLUE[fam]
        lanes = (cfg.rows + cfg.cols) / 2
        est["bram"] = bram
        est["dsp"] += gdsp
        extra_lut = lut + gl + gl_bus * cfg.bus_bits + gl_lane * lanes + C * rq["lut"]
        est["lut"] -= C * rq["lut"]
        # nextpnr-ecp5 counts 15% more LUT4 cells than yosys outside the array (carry
        # feed-in/out cells of the many short counters, LUT-RAM slices); measured at 8x8
        est["lut"] += extra_lut * (_PNR_LUT_FACTOR.get(fam, 1.0))
        est["ff"] += ff + gf + gf_bus * cfg.bus_bits + gf_lane * lanes
    else:
        raise ConfigError(f"unknown top {top!r}; use accelerator or array")
    if fam == "ice40":
        # a logic cell holds one LUT4 and one FF; most FFs here are fed by other FFs or
        # DSPs, so they need a cell of their own (packing pairs only LUT->FF chains)
        est["lut"] = est["lut"] + int(0.85 * est["ff"])
        est.setdefault("spram", 0)
    est = {k: (int(math.ceil(v)) if k != "bram" or fam != "xc7" else v) for k, v in est.items()}
    return est


# -- fit check ------------------------------------------------------------------------------
def _budget(board: Board, name):
    avail = board.resources.get(name, 0)
    return int(avail * UTILISATION_LIMIT.get(name, 1.0))


def fit_report(cfg, board, top=None):
    """``{resource: {"need", "available", "budget", "ok"}}`` for every resource."""
    board = get_board(board)
    est = estimate(cfg, board, top)
    out = {}
    for k, need in est.items():
        avail = board.resources.get(k, 0)
        budget = _budget(board, k)
        out[k] = {"need": need, "available": avail, "budget": budget, "ok": need <= budget}
    return out


def _describe(cfg, top):
    what = "array" if top == "array" else "accelerator"
    return f"a {cfg.rows}x{cfg.cols} int{cfg.input_bits} {what}"


def _pow2_upto(n):
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def max_array(board, base=None, top=None, fixed=None):
    """Largest (rows, cols) power-of-two array that fits ``board`` with ``base`` settings.

    ``fixed`` may pin ``rows`` or ``cols``. Returns ``(cfg, report)`` or ``(None, None)``.
    """
    board = get_board(board)
    base = dict(base or {})
    fixed = dict(fixed or {})
    cands = []
    for r in _pow2_upto(128):
        for c in _pow2_upto(128):
            if fixed.get("rows", r) != r or fixed.get("cols", c) != c:
                continue
            cands.append((r, c))
    # most MACs first; among equals prefer square, then more rows (longer reduction)
    cands.sort(key=lambda rc: (-rc[0] * rc[1], abs(math.log2(rc[0]) - math.log2(rc[1])), -rc[0]))
    for r, c in cands:
        d = dict(base, rows=r, cols=c)
        try:
            cfg = AcceleratorConfig.from_dict(d)
        except ConfigError:
            continue
        rep = fit_report(cfg, board, top)
        if all(v["ok"] for v in rep.values()):
            return cfg, rep
    return None, None


def check_fit(cfg: AcceleratorConfig, board, top=None):
    """Raise :class:`FitError` if ``cfg`` cannot fit ``board`` (analytical, milliseconds).

    The message names the limiting resource, the need and the budget, and a fix that is
    known to fit: a smaller array or smaller scratchpads when some configuration of
    ``top`` fits the board; when none does (the whole accelerator on an iCE40UP5K), it
    says so and names what fits instead -- the bare array (``--top array``) there, or the
    boards that hold an accelerator.
    """
    board = get_board(board)
    top = top or _TOP.get()
    rep = fit_report(cfg, board, top)
    bad = [k for k in ("dsp", "bram", "spram", "lut", "ff") if k in rep and not rep[k]["ok"]]
    if not bad:
        return rep
    k = max(bad, key=lambda n: rep[n]["need"] / max(1, rep[n]["budget"]))
    r = rep[k]
    prim = _PRIMITIVE[board.family].get(k, k)
    have = (f"has {r['available']} {prim}" if r["budget"] >= r["available"]
            else f"has {r['available']} {prim} ({r['budget']} usable at "
                 f"{int(UTILISATION_LIMIT[k] * 100)}%)")
    problem = f"{board.fpga.part} {have}; {_describe(cfg, top)} needs {r['need']}"
    others = {f: v for f, v in cfg.to_dict().items() if f not in ("rows", "cols")}
    free = {f: v for f, v in others.items() if f not in _SP_FIELDS}
    if _largest_fit(board, free, (), top) is None:
        raise FitError(f"{problem}; {_nothing_fits(board, free, top)}")
    # same array, scratchpads sized to fit (the BRAM-bound case)
    sized = _with_buffers(board, dict(free, rows=cfg.rows, cols=cfg.cols), top, set(free))
    if sized is not None and not all(fit_report(sized, board, top)[x]["ok"] for x in rep):
        sized = None
    best = _largest_fit(board, others, (), top)
    if best is not None:
        fix = f"use --rows auto --cols auto or at most {best.rows}x{best.cols}"
    else:
        best = _largest_fit(board, free, (), top)
        fix = (f"at most {best.rows}x{best.cols} fits, and only with smaller scratchpads than "
               "these: use --rows auto --cols auto without scratchpad options (it sizes them "
               "to fit)")
    if sized is not None and top != "array":
        fix = (f"shrink the scratchpads to fit a {cfg.rows}x{cfg.cols} array: "
               + " ".join(f"--{f.replace('_', '-')} {getattr(sized, f)}" for f in _SP_FIELDS)
               + f"; or {fix.removeprefix('use ')}")
    raise FitError(f"{problem}; {fix}")


def _nothing_fits(board, base, top):
    """The fix when no configuration of ``top`` fits ``board``: what does fit instead."""
    from . import list_boards
    what = "accelerator" if top == "accelerator" else top
    alts = []
    if top == "accelerator":
        arr = _largest_fit(board, base, (), "array")
        if arr is not None:
            alts.append(f"synthesize the bare systolic array there (--top array, up to "
                        f"{arr.rows}x{arr.cols})")
    fits = []
    for b in list_boards():
        if b.id == board.id:
            continue
        c = _largest_fit(b, base, (), top)
        if c is not None:
            fits.append(f"{b.id} (up to {c.rows}x{c.cols})")
    if fits:
        alts.append("use a board that holds one: " + ", ".join(fits))
    else:
        alts.append("no known board holds one (see `dnnfab boards`)")
    return (f"no {what} configuration fits {board.fpga.part} ({board.id}), not even 1x1 "
            f"with the smallest scratchpads; " + " or ".join(alts))


# -- auto-sizing ----------------------------------------------------------------------------
_SP_FIELDS = ("act_kib", "wgt_kib", "acc_kib", "out_kib")


def _with_buffers(board, d, top, explicit):
    """Largest power-of-two scratchpads (default 4:4:4:2 ratio) that fit next to the array."""
    if top == "array" or all(f in explicit for f in _SP_FIELDS):
        try:
            return AcceleratorConfig.from_dict(d)
        except ConfigError:
            return None
    defaults = AcceleratorConfig().to_dict()
    ratio = {f: defaults[f] / defaults["act_kib"] for f in _SP_FIELDS}
    best = None
    for act in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        dd = dict(d)
        for f in _SP_FIELDS:
            if f not in explicit:
                dd[f] = max(1, int(act * ratio[f]))
        try:
            cfg = AcceleratorConfig.from_dict(dd)
        except ConfigError:
            continue
        rep = fit_report(cfg, board, top)
        if all(v["ok"] for v in rep.values()):
            best = cfg
            break
    return best


def _largest_fit(board, base, auto_fixed, top):
    """The config with the largest power-of-two array (and scratchpads not in ``base``)
    that fits ``board``, or None. ``base`` may pin ``rows``/``cols`` unless they are in
    ``auto_fixed`` (the fields to size)."""
    base = dict(base)
    base.setdefault("clock_mhz", board.clock_mhz)
    explicit = set(base)
    fixed = {f: base[f] for f in ("rows", "cols") if f in base and f not in auto_fixed}
    cands = []
    for r in _pow2_upto(128):
        for c in _pow2_upto(128):
            if fixed.get("rows", r) == r and fixed.get("cols", c) == c:
                cands.append((r, c))
    cands.sort(key=lambda rc: (-rc[0] * rc[1], abs(math.log2(rc[0]) - math.log2(rc[1])), -rc[0]))
    for r, c in cands:
        d = dict(base, rows=r, cols=c)
        try:                           # cheap DSP pre-filter before sizing buffers
            probe = AcceleratorConfig.from_dict(d)
        except ConfigError:
            probe = None
        if probe is not None and estimate(probe, board, top)["dsp"] > _budget(board, "dsp"):
            continue
        cfg = _with_buffers(board, d, top, explicit)
        if cfg is not None:
            rep = fit_report(cfg, board, top)
            if all(v["ok"] for v in rep.values()):
                return cfg
    return None


def autosize(board, base, auto_fields, top=None):
    """Config with the largest array (and scratchpads) that fits ``board``.

    ``base`` is the dict of explicitly given config values; ``auto_fields`` lists the
    fields given as ``auto`` (``rows`` and/or ``cols``). Scratchpad sizes not given
    explicitly are chosen as the largest powers of two (keeping the default 4:4:4:2
    ratio) that fit the block RAM left over. Candidates are powers of two (the config
    requires it, and CNN channel counts are powers of two, so the array stays full).
    Raises :class:`FitError` when not even a 1x1 array fits (the message says what fits
    instead, see :func:`check_fit`).
    """
    board = get_board(board)
    top = top or _TOP.get()
    unknown = [f for f in auto_fields if f not in ("rows", "cols")]
    if unknown:
        raise ConfigError(f"only --rows and --cols can be 'auto' (got {', '.join(unknown)})")
    base = dict(base)
    base.setdefault("clock_mhz", board.clock_mhz)
    cfg = _largest_fit(board, base, auto_fields, top)
    if cfg is not None:
        return cfg
    explicit = set(base)
    one = AcceleratorConfig.from_dict(dict({k: v for k, v in base.items() if k not in auto_fields},
                                           **{f: 1 for f in ("rows", "cols") if f in auto_fields or f not in base},
                                           **{f: 1 for f in _SP_FIELDS if f not in explicit}))
    check_fit(one, board, top)   # raises with the limiting resource and what fits instead
    raise FitError(f"no configuration fits {board.fpga.part}; choose a larger board (see `dnnfab boards`)")
