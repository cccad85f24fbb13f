"""Program builder: one conv2d / GEMM layer -> accelerator instruction stream + DRAM images.

This is the core of the compiler. Given a :class:`~dnnfab.sw.compiler.layer.ConvLayer` and an
:class:`~dnnfab.hw.config.AcceleratorConfig` it decides

* the DRAM layout: activations NHWC with channels padded to ``max(R, C, bus bytes)``
  (so a layer's output is the next layer's input as is), weights as per-(M tile, K chunk)
  blocks of ``kh*kw*cb*R`` rows of C int8 (exactly the order the weight feeder streams),
  and per-M-tile aux blocks (bias', m, n of C channels, 8 bytes each);
* the tiling: output-row bands sized to the accumulator / activation / output
  scratchpads; M tiles of C output channels; K chunks when a weight block would not leave
  room for double buffering;
* scratchpad placement: act and out halves (ping-pong) when more than one band is
  needed, a ring of weight and aux slots;
* instruction order and dependency tokens: loads for the next compute are issued right
  after the current compute (prefetch), and every buffer reuse is protected by a token
  (assigned by :func:`assign_tokens`, which needs only "which earlier instruction must be
  done" per instruction).
"""

from dataclasses import dataclass, field
import math

import numpy as np

from ...errors import DnnfabError, ModelError
from ...hw.config import AcceleratorConfig
from ...hw.spec import (Load, Store, Compute, TARGET_ACT, TARGET_WGT, TARGET_AUX, INSN_BYTES, AUX_DTYPE,
                       AUX_LANE_BYTES, MAX_KERNEL, MAX_STRIDE, MAX_PAD, MAX_SIDE, MAX_CBP, MAX_OUT_BLOCKS,
                       MAX_K_TILES, MAX_ROW_BEATS)
from .layer import ConvLayer

__all__ = ["LayerProgram", "LayerPlan", "LayerSpan", "ProgramBuilder", "plan_layer", "compile_layer",
           "assign_tokens", "channel_pad", "UnsupportedLayerError"]

ALIGN = 4096


class UnsupportedLayerError(DnnfabError, ValueError):
    """The layer cannot be mapped onto this accelerator configuration."""


def _rows_of(beats):
    """Rows ``n1`` of a DMA transfer of ``beats`` bus beats: a row holds at most
    MAX_ROW_BEATS (65535) beats, so split evenly into the fewest rows that fit."""
    n1 = 1
    while beats // n1 > MAX_ROW_BEATS or beats % n1:
        n1 += 1
    return n1


def _ru(x, a):
    return -(-x // a) * a


@dataclass
class _Op:
    kind: str                     # "load" | "compute" | "store"
    insn: object
    needs: dict = field(default_factory=dict)   # channel -> index of producer op (global list)


@dataclass
class LayerProgram:
    """Everything needed to run one layer on the accelerator."""

    cfg: AcceleratorConfig
    layer: ConvLayer
    insns: list
    regions: dict                 # name -> (addr, size)
    images: dict                  # name -> bytes placed at regions[name][0]
    in_cp: int
    out_cp: int
    bands: list                   # (oh0, rows) per band
    computes: list                # Compute instructions in order (for the cycle model)

    @property
    def program_bytes(self):
        return b"".join(i.to_bytes() for i in self.insns)

    @property
    def array_beats(self):
        return sum(c.k_tiles * c.pixels for c in self.computes)

    @property
    def hw_macs(self):
        """MACs the array performs (including zero padding of channels): the MAC counter."""
        return self.array_beats * self.cfg.rows * self.cfg.cols

    def pack_input(self, x):
        """int8 NHWC [h, w, cin] -> DRAM bytes of the input region."""
        h, w = self.layer.in_hw
        x = np.asarray(x, np.int8).reshape(h, w, self.layer.cin)
        buf = np.zeros((h, w, self.in_cp), np.int8)
        buf[:, :, :self.layer.cin] = x
        return buf.tobytes()

    def unpack_output(self, raw):
        oh, ow = self.layer.out_hw
        arr = np.frombuffer(bytes(raw), np.int8)[: oh * ow * self.out_cp].reshape(oh, ow, self.out_cp)
        return arr[:, :, :self.layer.cout].copy()

    def dram_images(self, x=None):
        """[(addr, bytes)] to write into DRAM before starting (input too, if given)."""
        out = [(self.regions["program"][0], self.program_bytes)]
        for name in ("weights", "aux"):
            out.append((self.regions[name][0], self.images[name]))
        if x is not None:
            out.append((self.regions["input"][0], self.pack_input(x)))
        return out

    @property
    def dram_size(self):
        return max(a + s for a, s in self.regions.values())


def assign_tokens(ops):
    """Set the token flags of ``ops`` (program order) from each op's ``needs``.

    ``needs[channel] = j`` means the op may only start once op ``j`` has completed, where
    the channel names the queue pair: ``"l2c"`` (compute waits for a load), ``"c2l"``
    (load waits for a compute), ``"c2s"`` (store waits for a compute), ``"s2c"``
    (compute waits for a store). Tokens are counting semaphores consumed in queue order,
    so a consumer pops only when it needs a *later* producer than any earlier consumer
    did; that producer then pushes. Producers and consumers both advance in program
    order, so the i-th pop always meets the i-th push.
    """
    flags = {  # channel: (consumer flag, producer flag)
        "l2c": ("pop_prev", "push_next"),
        "c2l": ("pop_next", "push_prev"),
        "c2s": ("pop_prev", "push_next"),
        "s2c": ("pop_next", "push_prev"),
    }
    high = {ch: -1 for ch in flags}
    for op in ops:
        for ch, j in op.needs.items():
            if j is None or j <= high[ch]:
                continue
            pop, push = flags[ch]
            setattr(op.insn, pop, 1)
            setattr(ops[j].insn, push, 1)
            high[ch] = j


def channel_pad(cfg: AcceleratorConfig):
    """Channels of an activation pixel in DRAM are padded to a multiple of this."""
    return max(cfg.rows, cfg.cols, cfg.bus_bytes)


@dataclass
class LayerPlan:
    """The tiling of one layer and its weight/aux images, independent of where in DRAM the
    layer's tensors live (:func:`plan_layer`). :class:`ProgramBuilder` emits it."""

    layer: ConvLayer
    cfg: AcceleratorConfig
    in_cp: int
    out_cp: int
    cbp: int
    mt_n: int
    chunks: list                  # per M tile: [(c0, c1)] input-channel blocks of R (global)
    bands: list                   # (oh0, rows)
    n_act: int
    act_slot: int
    n_out: int
    out_slot: int
    slot_w: int
    n_wslots: int
    slot_aux: int
    n_auxslots: int
    wimg: bytes
    wblock: dict                  # (mt, ci) -> (offset in wimg, size)
    aimg: bytes

    @property
    def in_bytes(self):
        h, w = self.layer.in_hw
        return h * w * self.in_cp

    @property
    def out_bytes(self):
        oh, ow = self.layer.out_hw
        return oh * ow * self.out_cp

    @property
    def hw_macs(self):
        """MACs the array performs for this layer (channel padding and zero weights of
        grouped convs included)."""
        (kh, kw), (_, ow) = self.layer.kernel, self.layer.out_hw
        R, C = self.cfg.rows, self.cfg.cols
        blocks = sum(c1 - c0 for ch in self.chunks for c0, c1 in ch)
        return sum(rows for _, rows in self.bands) * ow * blocks * kh * kw * R * C

    def in_rows(self, oh0, rows):
        L = self.layer
        (kh, _), (sh, _), (dh, _) = L.kernel, L.stride, L.dilation
        h = L.in_hw[0]
        top = oh0 * sh - L.pad[0]
        bot = (oh0 + rows - 1) * sh - L.pad[0] + (kh - 1) * dh
        return max(0, top), min(h - 1, bot) + 1


def plan_layer(layer: ConvLayer, cfg: AcceleratorConfig) -> LayerPlan:
    """Tile ``layer`` for ``cfg``; raises :class:`UnsupportedLayerError` naming the limit."""
    R, C, bus = cfg.rows, cfg.cols, cfg.bus_bytes
    cin, cout, groups = layer.cin, layer.cout, layer.groups
    cin_g, cout_g = cin // groups, cout // groups
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel, layer.stride, layer.dilation
    pt, pl, pb, pr = layer.pad
    h, w = layer.in_hw
    oh_all, ow = layer.out_hw
    name = layer.name

    def need(cond, msg):
        if not cond:
            raise UnsupportedLayerError(f"layer {name}: {msg}")

    need(oh_all >= 1 and ow >= 1, f"output size {oh_all}x{ow} is empty; check padding and stride")
    need(kh <= MAX_KERNEL and kw <= MAX_KERNEL,
         f"kernel {kh}x{kw} exceeds {MAX_KERNEL}x{MAX_KERNEL}; split it or run the layer on the CPU")
    need(max(sh, sw, dh, dw) <= MAX_STRIDE, f"stride and dilation must be at most {MAX_STRIDE}")
    need(max(pt, pl) <= MAX_PAD, f"padding must be at most {MAX_PAD}")
    need(max(h, w, ow) <= MAX_SIDE, f"feature maps must be at most {MAX_SIDE} pixels on a side")

    in_cp = _ru(cin, channel_pad(cfg))
    out_cp = _ru(cout, channel_pad(cfg))
    cbp = in_cp // R
    cb_total = -(-cin // R)
    mt_n = -(-cout // C)
    need(cbp <= MAX_CBP, f"{cin} input channels exceed the {MAX_CBP} R-blocks an instruction can address")
    need(out_cp // C <= MAX_OUT_BLOCKS, f"{cout} output channels exceed {MAX_OUT_BLOCKS} C-blocks per pixel; "
                                         "use a config with more columns")

    act_bytes = cfg.act_kib * 1024
    wgt_bytes = cfg.wgt_kib * 1024
    out_bytes = cfg.out_kib * 1024
    aux_bytes = cfg.aux_kib * 1024
    acc_depth = cfg.sp_depth("acc_kib")

    # ---- the input-channel blocks each M tile reads: all of them for a dense conv; for
    # a grouped conv the blocks covering the groups of the tile's output channels
    span = []
    for mt in range(mt_n):
        o0, o1 = mt * C, min(cout, (mt + 1) * C)
        g0, g1 = o0 // cout_g, (o1 - 1) // cout_g
        span.append(((g0 * cin_g) // R, -(-((g1 + 1) * cin_g) // R)))
    widest = max(b1 - b0 for b0, b1 in span)

    # ---- K chunks: a weight block (one M tile, one chunk) must leave room for a second
    max_block = wgt_bytes // 2
    per_cb = kh * kw * R * C
    need(per_cb <= max_block, f"one weight block of {kh}x{kw}x{R}x{C} bytes does not fit half of the "
                              f"{cfg.wgt_kib} KiB weight scratchpad; increase wgt_kib")
    cbc = max(1, min(widest, max_block // per_cb))
    need(kh * kw * cbc <= MAX_K_TILES, "too many K tiles in one instruction")
    chunks = [[(c0, min(b1, c0 + cbc)) for c0 in range(b0, b1, cbc)] for b0, b1 in span]
    slot_w = _ru(per_cb * cbc, max(bus, C))
    n_wslots = wgt_bytes // slot_w
    slot_aux = _ru(C * AUX_LANE_BYTES, bus)
    n_auxslots = aux_bytes // slot_aux
    need(n_auxslots >= 2, f"aux scratchpad ({cfg.aux_kib} KiB) holds fewer than two {slot_aux}-byte slots")

    # ---- bands of output rows
    def in_rows(oh0, rows):
        top = oh0 * sh - pt
        bot = (oh0 + rows - 1) * sh - pt + (kh - 1) * dh
        return max(0, top), min(h - 1, bot) + 1

    def fits(rows, act_cap, out_cap):
        if rows * ow > acc_depth:
            return False
        worst = 0
        for oh0 in range(0, oh_all, rows):
            r0, r1 = in_rows(oh0, min(rows, oh_all - oh0))
            worst = max(worst, (r1 - r0) * w * in_cp)
        return worst <= act_cap and rows * ow * out_cp <= out_cap

    if fits(oh_all, act_bytes, out_bytes):
        bh, act_slot, out_slot, n_act, n_out = oh_all, act_bytes, out_bytes, 1, 1
    else:
        bh = 0
        for rows in range(min(oh_all, MAX_SIDE), 0, -1):
            if fits(rows, act_bytes // 2, out_bytes // 2):
                bh = rows
                break
        need(bh >= 1, f"one output row ({ow} pixels) does not fit the scratchpads "
                      f"(act {cfg.act_kib} KiB, out {cfg.out_kib} KiB, acc {acc_depth} rows); "
                      f"use a larger configuration or run the layer on the CPU")
        act_slot, out_slot, n_act, n_out = act_bytes // 2, out_bytes // 2, 2, 2
    # slots must start on bus-word and element boundaries
    act_slot -= act_slot % max(bus, R)
    out_slot -= out_slot % max(bus, C)
    bands = [(oh0, min(bh, oh_all - oh0)) for oh0 in range(0, oh_all, bh)]
    need(bh * ow < (1 << 24), "output tile too large")

    # ---- weight blocks in (mt, chunk) order; grouped convs: zeros outside the group
    wimg = bytearray()
    wblock = {}
    wpad = np.zeros((mt_n * C, cb_total * R, kh, kw), np.int8)
    for q in range(groups):
        wpad[q * cout_g:(q + 1) * cout_g, q * cin_g:(q + 1) * cin_g] = layer.weight[q * cout_g:(q + 1) * cout_g]
    for mt in range(mt_n):
        for ci, (c0, c1) in enumerate(chunks[mt]):
            blk = wpad[mt * C:(mt + 1) * C, c0 * R:c1 * R]               # [C, (c1-c0)*R, kh, kw]
            blk = blk.reshape(C, c1 - c0, R, kh, kw).transpose(3, 4, 1, 2, 0)  # kh, kw, cb, r, C
            raw = np.ascontiguousarray(blk).tobytes()
            raw += bytes(_ru(len(raw), bus) - len(raw))
            wblock[(mt, ci)] = (len(wimg), len(raw))
            wimg += raw
    aimg = bytearray()
    for mt in range(mt_n):
        lane = np.zeros(C, dtype=AUX_DTYPE)
        sl = slice(mt * C, min(cout, (mt + 1) * C))
        k = sl.stop - sl.start
        lane["bias"][:k] = layer.bias[sl]
        lane["m"][:k] = layer.m[sl]
        lane["n"][:k] = layer.n[sl]
        lane["m"][k:] = 1 << 14
        lane["n"][k:] = 1
        raw = lane.tobytes()
        aimg += raw + bytes(slot_aux - len(raw))
    return LayerPlan(layer=layer, cfg=cfg, in_cp=in_cp, out_cp=out_cp, cbp=cbp, mt_n=mt_n,
                     chunks=chunks, bands=bands, n_act=n_act, act_slot=act_slot, n_out=n_out,
                     out_slot=out_slot, slot_w=slot_w, n_wslots=n_wslots, slot_aux=slot_aux,
                     n_auxslots=n_auxslots, wimg=bytes(wimg), wblock=wblock, aimg=bytes(aimg))


class _Ranges:
    """The last instruction to use each byte range of a scratchpad (for WAR tokens)."""

    def __init__(self):
        self.items = []           # (lo, hi, op index)

    def last(self, lo, hi):
        best = None
        for a, b, op in self.items:
            if a < hi and lo < b and (best is None or op > best):
                best = op
        return best

    def add(self, lo, hi, op):
        self.items = [(a, b, o) for a, b, o in self.items if not (lo <= a and b <= hi)]
        self.items.append((lo, hi, op))


def _overlaps(a, b):
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


@dataclass
class LayerSpan:
    """Where one layer instance sits in a program: instructions ``[first, end)``, its
    Compute instructions and the DRAM addresses it reads and writes."""
    name: str
    first: int
    end: int
    computes: list
    in_addr: int
    out_addr: int
    hw_macs: int


class ProgramBuilder:
    """Emits the instruction stream of one or more layers into one program.

    Each layer goes in with :meth:`add` (its :class:`LayerPlan` and the DRAM addresses of
    its input, output, weight and aux images). Scratchpad reuse across layers is ordered
    by tokens from byte-range tracking, and a layer's slot rings start where the previous
    layer's last use does not overlap, so its first weight loads run during the previous
    layer's tail. A layer that reads a tensor stored earlier in the same program
    (``after_stores=True``) waits for those stores through a *barrier*: a one-pixel,
    non-finalizing COMPUTE that pops the store engine's token and pushes the load engine's
    (LOAD has no token from STORE; COMPUTE bridges them). It writes only accumulator row 0,
    which the next job re-initializes.
    """

    def __init__(self, cfg: AcceleratorConfig):
        self.cfg = cfg
        self.ops = []
        self.readers = {TARGET_ACT: _Ranges(), TARGET_WGT: _Ranges(), TARGET_AUX: _Ranges()}
        self.out_readers = _Ranges()          # stores reading the output scratchpad
        self.last_store = None
        self.last_range = {}                  # "act"/"wgt"/"aux"/"out" -> last byte range used
        self.aux_next = 0
        self.spans = []

    def _emit(self, op):
        self.ops.append(op)
        return len(self.ops) - 1

    def _load(self, addr, nbytes, sp_byte, target, extra=None):
        bus = self.cfg.bus_bytes
        beats = nbytes // bus
        n1 = _rows_of(beats)
        ins = Load(addr=addr, len0=beats // n1, n1=n1, stride1=(beats // n1) * bus,
                   sp_addr=sp_byte // bus, target=target)
        dep = self.readers[target].last(sp_byte, sp_byte + nbytes)
        if extra is not None:
            dep = extra if dep is None else max(dep, extra)
        return self._emit(_Op("load", ins, {"c2l": dep}))

    def _first_slot(self, n, size, kind):
        """The first slot of a ring of ``n`` slots of ``size`` bytes that does not overlap
        the previous layer's last use of the scratchpad (0 if none does)."""
        prev = self.last_range.get(kind)
        for s in range(n):
            if not _overlaps((s * size, (s + 1) * size), prev):
                return s
        return 0

    def add(self, plan: LayerPlan, in_addr, out_addr, w_addr, aux_addr, after_stores=False,
            name=None):
        cfg, L = self.cfg, plan.layer
        R, C, bus = cfg.rows, cfg.cols, cfg.bus_bytes
        h, w = L.in_hw
        _, ow = L.out_hw
        (kh, kw), (sh, sw), (dh, dw) = L.kernel, L.stride, L.dilation
        pt, pl = L.pad[0], L.pad[1]
        bands, chunks = plan.bands, plan.chunks
        first = len(self.ops)
        s_act = self._first_slot(plan.n_act, plan.act_slot, "act")
        s_out = self._first_slot(plan.n_out, plan.out_slot, "out")
        s_w = self._first_slot(plan.n_wslots, plan.slot_w, "wgt")
        a0 = self.aux_next
        act_slot_of = lambda bi: (s_act + bi) % plan.n_act
        out_slot_of = lambda bi: (s_out + bi) % plan.n_out
        wslot_of = lambda j: (s_w + j) % plan.n_wslots
        aslot_of = lambda j: (a0 + j) % plan.n_auxslots
        plan_j = [(bi, mt, ci) for bi in range(len(bands)) for mt in range(plan.mt_n)
                  for ci in range(len(chunks[mt]))]
        computes = []
        act_loads = {}
        wl = {}
        barrier = None

        def load_act(bi):
            oh0, rows = bands[bi]
            r0, r1 = plan.in_rows(oh0, rows)
            sp = act_slot_of(bi) * plan.act_slot
            act_loads[bi] = self._load(in_addr + r0 * w * plan.in_cp, (r1 - r0) * w * plan.in_cp,
                                       sp, TARGET_ACT, extra=barrier)

        def load_weights(j):
            bi, mt, ci = plan_j[j]
            off, size = plan.wblock[(mt, ci)]
            i1 = self._load(w_addr + off, size, wslot_of(j) * plan.slot_w, TARGET_WGT)
            i2 = self._load(aux_addr + mt * plan.slot_aux, plan.slot_aux,
                            aslot_of(j) * plan.slot_aux, TARGET_AUX)
            wl[j] = (i1, i2)

        if after_stores and self.last_store is not None:
            load_weights(0)
            ins = Compute(acc_init=0, finalize=0, a_base=0, w_base=0, acc_base=0, aux_addr=0,
                          out_base=0, out_stride=1, oh_n=1, ow_n=1, kh_n=1, kw_n=1, cb_n=1,
                          hin=1, win=1, cbp=1, sh=1, sw=1, dh=1, dw=1, pt=0, pl=0,
                          zx=0, zy=0, lo=0, hi=0)
            barrier = self._emit(_Op("compute", ins, {"s2c": self.last_store}))
            computes.append(ins)
            load_act(0)
        else:
            load_act(0)
            load_weights(0)
        for j, (bi, mt, ci) in enumerate(plan_j):
            oh0, rows = bands[bi]
            r0, r1 = plan.in_rows(oh0, rows)
            c0, c1 = chunks[mt][ci]
            aslot, oslot = act_slot_of(bi), out_slot_of(bi)
            ws, xs = wslot_of(j), aslot_of(j)
            ins = Compute(
                acc_init=int(ci == 0), finalize=int(ci == len(chunks[mt]) - 1),
                a_base=(aslot * plan.act_slot) // R + c0,
                w_base=(ws * plan.slot_w) // C,
                acc_base=0,
                aux_addr=(xs * plan.slot_aux) // (C * AUX_LANE_BYTES),
                out_base=(oslot * plan.out_slot) // C + mt,
                out_stride=plan.out_cp // C,
                oh_n=rows, ow_n=ow, kh_n=kh, kw_n=kw, cb_n=c1 - c0,
                hin=r1 - r0, win=w, cbp=plan.cbp, sh=sh, sw=sw, dh=dh, dw=dw,
                pt=r0 - (oh0 * sh - pt), pl=pl, zx=L.zx, zy=L.zy, lo=L.lo, hi=L.hi)
            assert 0 <= ins.pt <= MAX_PAD
            o_lo = oslot * plan.out_slot
            needs = {"l2c": max(act_loads[bi], *wl[j]),
                     "s2c": self.out_readers.last(o_lo, o_lo + plan.out_slot)}
            ci_idx = self._emit(_Op("compute", ins, needs))
            computes.append(ins)
            a_lo = aslot * plan.act_slot
            self.readers[TARGET_ACT].add(a_lo, a_lo + plan.act_slot, ci_idx)
            self.readers[TARGET_WGT].add(ws * plan.slot_w, (ws + 1) * plan.slot_w, ci_idx)
            self.readers[TARGET_AUX].add(xs * plan.slot_aux, (xs + 1) * plan.slot_aux, ci_idx)
            self.last_range.update(act=(a_lo, a_lo + plan.act_slot),
                                   wgt=(ws * plan.slot_w, (ws + 1) * plan.slot_w))
            # prefetch: the next compute's inputs
            if j + 1 < len(plan_j):
                nb = plan_j[j + 1][0]
                if nb != bi:
                    load_act(nb)
                load_weights(j + 1)
            # band finished: store it
            if j + 1 == len(plan_j) or plan_j[j + 1][0] != bi:
                nbytes = rows * ow * plan.out_cp
                beats = nbytes // bus
                n1 = _rows_of(beats)
                sp = oslot * plan.out_slot
                st = Store(addr=out_addr + oh0 * ow * plan.out_cp, len0=beats // n1, n1=n1,
                           stride1=(beats // n1) * bus, sp_addr=sp // bus)
                self.last_store = self._emit(_Op("store", st, {"c2s": ci_idx}))
                self.out_readers.add(sp, sp + plan.out_slot, self.last_store)
                self.last_range["out"] = (sp, sp + plan.out_slot)
        self.aux_next = (a0 + len(plan_j)) % plan.n_auxslots
        span = LayerSpan(name=name or L.name, first=first, end=len(self.ops), computes=computes,
                         in_addr=in_addr, out_addr=out_addr, hw_macs=plan.hw_macs)
        self.spans.append(span)
        return span

    def finish(self):
        """Assign the tokens and return the instruction list."""
        assign_tokens(self.ops)
        return [op.insn for op in self.ops]

    def relocate(self, shift):
        """Move every DMA address by ``shift`` bytes."""
        for op in self.ops:
            if op.kind in ("load", "store"):
                op.insn.addr += shift
        for s in self.spans:
            s.in_addr += shift
            s.out_addr += shift


def compile_layer(layer: ConvLayer, cfg: AcceleratorConfig, base_addr=0) -> LayerProgram:
    """One layer as a program of its own, with its own DRAM regions (program, input,
    weights, aux, output). Whole networks: :mod:`dnnfab.sw.compiler.network`."""
    plan = plan_layer(layer, cfg)
    regions = {}
    cursor = base_addr

    def region(nm, size):
        nonlocal cursor
        cursor = _ru(cursor, ALIGN)
        regions[nm] = (cursor, size)
        cursor += size

    region("program", 0)   # sized below
    region("input", plan.in_bytes)
    region("weights", len(plan.wimg))
    region("aux", len(plan.aimg))
    region("output", plan.out_bytes)
    b = ProgramBuilder(cfg)
    b.add(plan, regions["input"][0], regions["output"][0], regions["weights"][0], regions["aux"][0])
    insns = b.finish()
    prog_size = len(insns) * INSN_BYTES
    # the program region was sized 0 above: move everything else if it would overlap
    regions["program"] = (regions["program"][0], prog_size)
    if regions["program"][0] + prog_size > regions["input"][0]:
        shift = _ru(regions["program"][0] + prog_size, ALIGN) - regions["input"][0]
        for k in ("input", "weights", "aux", "output"):
            a, s = regions[k]
            regions[k] = (a + shift, s)
        b.relocate(shift)
    return LayerProgram(cfg=cfg, layer=layer, insns=insns, regions=regions,
                        images={"weights": plan.wimg, "aux": plan.aimg},
                        in_cp=plan.in_cp, out_cp=plan.out_cp, bands=plan.bands,
                        computes=b.spans[0].computes)
