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

__all__ = ["LayerProgram", "compile_layer", "assign_tokens", "UnsupportedLayerError"]

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


def compile_layer(layer: ConvLayer, cfg: AcceleratorConfig, base_addr=0) -> LayerProgram:
    R, C, bus = cfg.rows, cfg.cols, cfg.bus_bytes
    cin, cout = layer.cin, layer.cout
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

    in_cp = _ru(cin, max(R, C, bus))
    out_cp = _ru(cout, max(R, C, bus))
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

    # ---- K chunks: a weight block (one M tile, one chunk) must leave room for a second
    max_block = wgt_bytes // 2
    per_cb = kh * kw * R * C
    need(per_cb <= max_block, f"one weight block of {kh}x{kw}x{R}x{C} bytes does not fit half of the "
                              f"{cfg.wgt_kib} KiB weight scratchpad; increase wgt_kib")
    cbc = max(1, min(cb_total, max_block // per_cb))
    need(kh * kw * cbc <= MAX_K_TILES, "too many K tiles in one instruction")
    chunks = [(c0, min(cb_total, c0 + cbc)) for c0 in range(0, cb_total, cbc)]
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

    # ---- DRAM layout
    regions = {}
    cursor = base_addr

    def region(nm, size):
        nonlocal cursor
        cursor = _ru(cursor, ALIGN)
        regions[nm] = (cursor, size)
        cursor += size

    # weights blob: blocks in (mt, chunk) order
    wimg = bytearray()
    wblock = {}
    wpad = np.zeros((mt_n * C, cb_total * R, kh, kw), np.int8)
    wpad[:cout, :cin] = layer.weight
    for mt in range(mt_n):
        for ci, (c0, c1) in enumerate(chunks):
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
    region("program", 0)   # sized below
    region("input", h * w * in_cp)
    region("weights", len(wimg))
    region("aux", len(aimg))
    region("output", oh_all * ow * out_cp)

    # ---- instruction stream
    ops = []
    last_reader = {}        # ("act"|"wgt"|"aux", slot) -> op index of the last compute using it
    last_store_of_out = {}  # out slot -> store op index
    computes = []

    def emit(op):
        ops.append(op)
        return len(ops) - 1

    def load(addr, nbytes, sp_byte, unit, target, slot_key):
        beats = nbytes // bus
        n1 = _rows_of(beats)
        ins = Load(addr=addr, len0=beats // n1, n1=n1, stride1=(beats // n1) * bus,
                   sp_addr=sp_byte // bus, target=target)
        return emit(_Op("load", ins, {"c2l": last_reader.get(slot_key)}))

    job = 0
    act_loads = {}

    def load_act(bi):
        oh0, rows = bands[bi]
        r0, r1 = in_rows(oh0, rows)
        slot = bi % n_act
        act_loads[bi] = load(regions["input"][0] + r0 * w * in_cp, (r1 - r0) * w * in_cp,
                             slot * act_slot, R, TARGET_ACT, ("act", slot))

    plan = [(bi, mt, ci) for bi in range(len(bands)) for mt in range(mt_n) for ci in range(len(chunks))]
    wl = {}

    def load_weights(j):
        bi, mt, ci = plan[j]
        off, size = wblock[(mt, ci)]
        ws = j % n_wslots
        a = j % n_auxslots
        i1 = load(regions["weights"][0] + off, size, ws * slot_w, C, TARGET_WGT, ("wgt", ws))
        i2 = load(regions["aux"][0] + mt * slot_aux, slot_aux, a * slot_aux, C * AUX_LANE_BYTES, TARGET_AUX, ("aux", a))
        wl[j] = (i1, i2)

    load_act(0)
    load_weights(0)
    for j, (bi, mt, ci) in enumerate(plan):
        oh0, rows = bands[bi]
        r0, r1 = in_rows(oh0, rows)
        c0, c1 = chunks[ci]
        aslot, oslot = bi % n_act, bi % n_out
        ins = Compute(
            acc_init=int(ci == 0), finalize=int(ci == len(chunks) - 1),
            a_base=(aslot * act_slot) // R + c0,
            w_base=((j % n_wslots) * slot_w) // C,
            acc_base=0,
            aux_addr=((j % n_auxslots) * slot_aux) // (C * AUX_LANE_BYTES),
            out_base=(oslot * out_slot) // C + mt,
            out_stride=out_cp // C,
            oh_n=rows, ow_n=ow, kh_n=kh, kw_n=kw, cb_n=c1 - c0,
            hin=r1 - r0, win=w, cbp=cbp, sh=sh, sw=sw, dh=dh, dw=dw,
            pt=r0 - (oh0 * sh - pt), pl=pl, zx=layer.zx, zy=layer.zy, lo=layer.lo, hi=layer.hi)
        assert 0 <= ins.pt <= MAX_PAD
        needs = {"l2c": max(act_loads[bi], *wl[j]), "s2c": last_store_of_out.get(oslot)}
        ci_idx = emit(_Op("compute", ins, needs))
        computes.append(ins)
        last_reader[("act", aslot)] = ci_idx
        last_reader[("wgt", j % n_wslots)] = ci_idx
        last_reader[("aux", j % n_auxslots)] = ci_idx
        # prefetch: the next compute's inputs
        if j + 1 < len(plan):
            nb = plan[j + 1][0]
            if nb != bi:
                load_act(nb)
            load_weights(j + 1)
        # band finished: store it
        if j + 1 == len(plan) or plan[j + 1][0] != bi:
            nbytes = rows * ow * out_cp
            beats = nbytes // bus
            n1 = _rows_of(beats)
            st = Store(addr=regions["output"][0] + oh0 * ow * out_cp, len0=beats // n1, n1=n1,
                       stride1=(beats // n1) * bus, sp_addr=(oslot * out_slot) // bus)
            last_store_of_out[oslot] = emit(_Op("store", st, {"c2s": ci_idx}))

    assign_tokens(ops)
    insns = [op.insn for op in ops]
    prog_size = len(insns) * INSN_BYTES
    # the program region was sized 0 above: move everything else if it would overlap
    regions["program"] = (regions["program"][0], prog_size)
    if regions["program"][0] + prog_size > regions["input"][0]:
        shift = _ru(regions["program"][0] + prog_size, ALIGN) - regions["input"][0]
        for k in ("input", "weights", "aux", "output"):
            a, s = regions[k]
            regions[k] = (a + shift, s)
        for op in ops:
            if op.kind in ("load", "store"):
                op.insn.addr += shift
    return LayerProgram(cfg=cfg, layer=layer, insns=insns, regions=regions,
                        images={"weights": bytes(wimg), "aux": bytes(aimg)},
                        in_cp=in_cp, out_cp=out_cp, bands=bands, computes=computes)
