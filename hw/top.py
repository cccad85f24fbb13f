"""The whole accelerator: AXI4 master (DMA) + AXI4-Lite slave (CSR) + interrupt.

::

            s_axil ──► CSRBank ──► CTRL/STATUS/PROG_*/OUT_* ─┐        ┌─► irq
                                                            ▼        │
    m_axi ◄──► DMA ◄──► Controller (fetch, queues, tokens) ──┴─ perf counters
                │ ▲                  │
                ▼ │                  ▼
        act/wgt/aux scratchpads ──► ComputeEngine (array, accumulators, requantizer)
                  out scratchpad ◄──┘

Ports are ``clk``, ``rst``, ``m_axi__*`` (AXI4 with IDs), ``s_axil__*`` (AXI4-Lite) and
``irq``. ``CTRL.SOFT_RESET`` resets the datapath (DMA, controller, compute) but not the
registers. Scratchpad and register-map details: ``docs/accelerator.md``.
"""

from amaranth.hdl import Signal, Module, ResetInserter, Cat
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from .config import AcceleratorConfig
from .axi import axi4_signature, axi4lite_signature
from .csr import CSRBank
from .regmap import accelerator_regmap, COUNTERS, ERR_SP_RANGE
from .dma import DMA, desc_layout
from .scratchpad import Scratchpad, dup_reg
from .pe import dreg
from .compute import ComputeEngine, AUX_LANE_BITS
from .controller import Controller
from .isa import TARGET_ACT, TARGET_WGT, TARGET_INSN, TARGET_AUX, INSN_BITS
from ..errors import ConfigError

__all__ = ["Accelerator", "CSR_ADDR_BITS"]

CSR_ADDR_BITS = 12


class Accelerator(wiring.Component):
    """dnnfab accelerator top level.

    Members
    -------
    m_axi : ``Out(axi4_signature(addr_bits, bus_bits, id_bits))``
        Memory port (DRAM): instruction fetch, loads, stores.
    s_axil : ``In(axi4lite_signature(12, 32))``
        Host register port; see :func:`dnnfab.hw.regmap.accelerator_regmap`.
    irq : ``Out(1)``
        Level interrupt: ``IRQ_STATUS & IRQ_ENABLE`` is non-zero.
    """

    def __init__(self, config: AcceleratorConfig):
        if config.bus_bits > INSN_BITS:
            raise ConfigError(f"bus_bits={config.bus_bits} is wider than an instruction; use <= {INSN_BITS}")
        self.config = config
        self.regmap = accelerator_regmap(config)
        super().__init__({
            "m_axi": Out(axi4_signature(config.addr_bits, config.bus_bits, config.id_bits)),
            "s_axil": In(axi4lite_signature(CSR_ADDR_BITS, 32)),
            "irq": Out(1),
        })

    def manifest_extra(self):
        from . import spec as isa
        from .spec import array_latency as latency, min_tile_rows
        cfg = self.config
        return {
            "regmap": self.regmap.to_dict(),
            "isa": {"insn_bits": isa.INSN_BITS, "opcodes": isa.OPCODES,
                    "load_store_fields": isa.HEADER + isa.DMA_FIELDS,
                    "compute_fields": isa.HEADER + isa.COMPUTE_FIELDS},
            "array": {"latency": latency(cfg.rows, cfg.cols), "min_tile_rows": min_tile_rows(cfg.rows, cfg.cols)},
            "scratchpads": {name: {"bytes": getattr(cfg, name) * 1024} for name in
                            ("act_kib", "wgt_kib", "acc_kib", "out_kib", "aux_kib")},
        }

    def elaborate(self, platform):
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        m = Module()

        m.submodules.csr = csr = CSRBank(self.regmap, CSR_ADDR_BITS)
        wiring.connect(m, wiring.flipped(self.s_axil), csr.bus)
        start = csr.ctrl[0]
        soft_reset = csr.ctrl[1]
        clear_error = csr.ctrl[2]

        def dp(name, elaboratable):
            # each block resets from a registered copy of the pulse of its own (a distinct
            # flip-flop that the placer can put near the block: one net from the CSR bank
            # to every block's reset pins spans the die), so SOFT_RESET acts one cycle
            # after the CTRL write
            srst = dup_reg(m, platform, soft_reset, f"{name}_srst")
            m.submodules[name] = ResetInserter(srst)(elaboratable)
            return elaboratable

        dma = dp("dma", DMA(cfg))
        ctrl = dp("controller", Controller(cfg, desc_layout(cfg)))
        comp = dp("compute", ComputeEngine(cfg))
        act = dp("act_sp", Scratchpad(cfg.act_kib * 1024, cfg.bus_bits, R * cfg.input_bits))
        wgt = dp("wgt_sp", Scratchpad(cfg.wgt_kib * 1024, cfg.bus_bits, C * cfg.weight_bits))
        aux = dp("aux_sp", Scratchpad(cfg.aux_kib * 1024, cfg.bus_bits, C * AUX_LANE_BITS))
        out = dp("out_sp", Scratchpad(cfg.out_kib * 1024, C * cfg.input_bits, cfg.bus_bits))

        wiring.connect(m, dma.bus, wiring.flipped(self.m_axi))
        wiring.connect(m, ctrl.rd_cmd, dma.rd_cmd)
        wiring.connect(m, ctrl.wr_cmd, dma.wr_cmd)
        wiring.connect(m, ctrl.cinsn, comp.insn)

        # DMA -> scratchpads / instruction beats
        for sp, tgt in ((act, TARGET_ACT), (wgt, TARGET_WGT), (aux, TARGET_AUX)):
            m.d.comb += [sp.w_en.eq(dma.sp_we & (dma.sp_wtarget == tgt)),
                         sp.w_addr.eq(dma.sp_waddr), sp.w_data.eq(dma.sp_wdata)]
        m.d.comb += [ctrl.ins_we.eq(dma.sp_we & (dma.sp_wtarget == TARGET_INSN)),
                     ctrl.ins_data.eq(dma.sp_wdata)]
        # output scratchpad -> DMA
        m.d.comb += [out.r_en.eq(dma.sp_re), out.r_addr.eq(dma.sp_raddr), dma.sp_rdata.eq(out.r_data)]
        # compute engine <-> scratchpads
        m.d.comb += [
            act.r_en.eq(comp.act_rd_en), act.r_addr.eq(comp.act_rd_addr), comp.act_rd_data.eq(act.r_data),
            wgt.r_en.eq(comp.wgt_rd_en), wgt.r_addr.eq(comp.wgt_rd_addr), comp.wgt_rd_data.eq(wgt.r_data),
            aux.r_en.eq(comp.aux_rd_en), aux.r_addr.eq(comp.aux_rd_addr), comp.aux_rd_data.eq(aux.r_data),
            out.w_en.eq(comp.out_wr_en), out.w_addr.eq(comp.out_wr_addr), out.w_data.eq(comp.out_wr_data),
        ]

        # faults
        sp_range = Signal()
        with m.If(act.oob | wgt.oob | aux.oob | out.oob):
            m.d.sync += sp_range.eq(1)
        with m.If(start | clear_error | soft_reset):
            m.d.sync += sp_range.eq(0)
        m.d.comb += [
            dma.clear.eq(start | clear_error),
            dma.window_lo.eq(csr.out_lo), dma.window_hi.eq(csr.out_hi),
            ctrl.start.eq(start), ctrl.prog_base.eq(csr.prog_base), ctrl.prog_len.eq(csr.prog_len),
            ctrl.rd_done.eq(dma.rd_done), ctrl.wr_done.eq(dma.wr_done),
            ctrl.c_done_read.eq(comp.done_read), ctrl.c_done_write.eq(comp.done_write),
            ctrl.c_idle.eq(comp.idle), ctrl.dma_busy.eq(dma.busy),
            ctrl.fault.eq(dma.error | sp_range),
            # (code and address as registered a cycle after the fault: the controller
            # takes them then)
            ctrl.fault_code.eq(dma.error_code_q),
            ctrl.fault_info.eq(dma.error_addr_q),
        ]
        with m.If(~dma.error_q):
            m.d.comb += [ctrl.fault_code.eq(ERR_SP_RANGE), ctrl.fault_info.eq(0)]

        # status, interrupt
        # (through registers: the run-control flip-flops then sit by the controller, and
        # the status bits reach the CSR bank across the die a cycle later, all together)
        status = Signal(16)
        error_info = dreg(32, name="error_info_q")
        done_q = Signal()
        m.d.sync += [status.eq(Cat(ctrl.busy, ctrl.done, ctrl.error, 0, 0, 0, 0, 0, ctrl.error_code)),
                     error_info.eq(ctrl.error_info), done_q.eq(status[1])]
        m.d.comb += [csr.status.eq(status), csr.error_info.eq(error_info)]
        # both causes fire when the run has ended (after an error: once the DMA drained)
        ended = status[1] & ~done_q
        m.d.comb += csr.irq_status_set.eq(Cat(ended, ended & status[2]))
        m.d.comb += self.irq.eq((csr.irq_status & csr.irq_enable) != 0)

        # performance counters (cleared by START). Each increment is registered twice
        # first: its inputs come from deep inside the blocks (e.g. the compute engine's
        # back-end handshake), and the 64-bit adder after them was the whole design's
        # critical path (13.1 ns, 76.5 MHz); with one register, the route from it to the
        # counter (which sits by the CSR read multiplexer) still ended the INSNS carry chain
        # 8.3 ns late. An increment made of several terms has each term registered on its
        # own and combines them in the second stage (STALL_CYCLES: the compute engine's
        # ``idle``, the AND after it and the route between them were a 6.7 ns path).
        # Counts lag by two cycles; every increment is 0 outside a run, so a START-cleared
        # counter never picks up a stale one.
        def one(v):
            return [v], lambda t: t
        incs = {                                    # name: (terms, their combination)
            "CYCLES": one(ctrl.busy),
            "BUSY_CYCLES": one(comp.act_beat),
            "MACS": one(comp.act_beat * (R * C)),
            "DMA_RD_BYTES": one(dma.rd_beat * cfg.bus_bytes),
            "DMA_WR_BYTES": one(dma.wr_beat * cfg.bus_bytes),
            "STALL_CYCLES": ([ctrl.busy, comp.act_beat, ctrl.compute_waiting, comp.idle],
                             lambda busy, beat, waiting, idle: busy & ~beat & (waiting | ~idle)),
            "INSNS": one(ctrl.retired),
        }
        assert set(incs) == set(COUNTERS)
        for name, (terms, combine) in incs.items():
            low = name.lower()
            cnt = Signal(64, name=f"perf_{low}")
            shape = (range(int(R * C) + 1) if name == "MACS" else
                     range(cfg.bus_bytes + 1) if name.startswith("DMA") else 1)
            t_p = ([Signal(shape, name=f"perf_{low}_inc_p")] if len(terms) == 1 else
                   [Signal(name=f"perf_{low}_t{i}") for i in range(len(terms))])
            inc_q = Signal(shape, name=f"perf_{low}_inc")
            m.d.sync += [a.eq(b) for a, b in zip(t_p, terms)]
            m.d.sync += inc_q.eq(combine(*t_p))
            with m.If(start):
                m.d.sync += cnt.eq(0)
            with m.Else():
                m.d.sync += cnt.eq(cnt + inc_q)
            m.d.comb += [csr.port(f"{name}_LO").eq(cnt[:32]), csr.port(f"{name}_HI").eq(cnt[32:])]
        return m
