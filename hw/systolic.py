"""R x C weight-stationary systolic array with built-in skew/deskew and stream ports.

Dataflow (weight-stationary, as in Gemmini/TPU): the array holds an R x C weight tile
``W[k, m]`` (k = row = reduction index, m = column = output channel). Each ``act`` beat is
one row vector ``x[p, 0:R]`` of a pixel/row ``p``; each ``out`` beat is the int32 vector
``sum_k x[p, k] * W[k, 0:C]``. Beats are skewed into the rows on the way in and de-skewed
on the way out, so the streams are plain row vectors.

Weights are double-buffered inside the PEs: the ``wgt`` stream loads the next tile (R beats,
row 0 first) into shadow registers while the current tile streams; the ``act`` beat
flagged ``first`` switches every PE to the new tile as it reaches it. Tiles therefore follow
each other without bubbles whenever a tile is at least :func:`dnnfab.hw.spec.min_tile_rows`
rows long (otherwise the weight preload sets the pace).

Timing (exact; asserted against RTL in the tests):

* latency ``L = R + C + 3`` cycles from an ``act`` transfer to its ``out`` beat;
* after a ``first`` beat enters, ``R + C`` cycles pass before the shadow accepts the next
  tile's weights (every PE has copied it by then), and the load takes ``R`` cycles;
* hence a tile starts ``max(npx_prev, 2R + C + 1)`` cycles after the previous one, see
  :func:`stream_cycles`.

Backpressure: ``out.ready`` low with ``out.valid`` high freezes the whole pipeline (a
global enable); ``act.ready`` drops while frozen.
"""

from amaranth.hdl import Signal, Module, Const, Mux, Shape, signed, unsigned
from amaranth.lib import wiring, stream, data
from amaranth.lib.wiring import In, Out

from .config import AcceleratorConfig
from .pe import ProcessingElement, dreg
from .spec import array_latency, min_tile_rows

__all__ = ["SystolicArray", "act_layout", "out_layout", "stream_cycles"]


def act_layout(cfg: AcceleratorConfig, tag_bits=0):
    fields = {"data": data.ArrayLayout(signed(cfg.input_bits), cfg.rows), "first": 1}
    if tag_bits:
        fields["tag"] = unsigned(tag_bits)
    return data.StructLayout(fields)


def wgt_layout(cfg: AcceleratorConfig):
    return data.ArrayLayout(signed(cfg.weight_bits), cfg.cols)


def out_layout(cfg: AcceleratorConfig, tag_bits=0):
    fields = {"data": data.ArrayLayout(signed(cfg.acc_bits), cfg.cols)}
    if tag_bits:
        fields["tag"] = unsigned(tag_bits)
    return data.StructLayout(fields)


def psum_bits(cfg: AcceleratorConfig, n):
    """Width of a partial sum of ``n`` products: the exact range of ``n`` signed
    ``input_bits x weight_bits`` products (e.g. int8: 16 bits for one, 17 for two or
    three, 19 for eight), at most ``acc_bits``. Row ``r`` of the array carries ``r + 1``
    products: narrower adders and partial-sum wires than ``acc_bits`` everywhere, with
    the same values (a sum of that many products cannot leave the range)."""
    a, w = 1 << (cfg.input_bits - 1), 1 << (cfg.weight_bits - 1)
    lo, hi = -n * max(a * (w - 1), (a - 1) * w), n * a * w
    bits = Shape.cast(range(lo, hi + 1)).width
    return min(bits, cfg.acc_bits)




def stream_cycles(rows, cols, tiles):
    """Analytical cycle count of streaming ``tiles`` (a list of row counts) through the array.

    Assumes weights and activations are always available and ``out`` is always ready.
    Counts from the cycle the first weight beat transfers up to and including the cycle
    the last ``out`` beat transfers.
    """
    tiles = list(tiles)
    if not tiles:
        return 0
    start = rows                      # the first tile's preload takes R cycles
    for npx in tiles[:-1]:
        start += max(npx, min_tile_rows(rows, cols))
    return start + tiles[-1] + array_latency(rows, cols)


class SystolicArray(wiring.Component):
    """R x C weight-stationary systolic array.

    Parameters
    ----------
    config : AcceleratorConfig
        Uses ``rows``, ``cols``, ``input_bits``, ``weight_bits``, ``acc_bits``.
    tag_bits : int
        Width of a side-band tag carried from each ``act`` beat to its ``out`` beat
        (the accelerator uses it for accumulator addresses and flags). 0 omits it.

    Members
    -------
    act : ``In(stream.Signature(act_layout))``
        One activation row per beat: ``data`` (R signed values), ``first`` (this beat
        starts a new weight tile: switch to the preloaded weights), ``tag``.
        A ``first`` beat waits (``ready`` low) until a full tile has been preloaded.
    wgt : ``In(stream.Signature(ArrayLayout(signed(weight_bits), C)))``
        Weight rows of the next tile, row 0 (reduction index 0) first, R beats per tile.
    out : ``Out(stream.Signature(out_layout))``
        One partial-sum row per ``act`` beat, in order: ``data`` (C signed sums), ``tag``.
    busy : ``Out(1)``
        Beats are in flight inside the array.
    """

    def __init__(self, config: AcceleratorConfig, tag_bits=0):
        self.config = config
        self.tag_bits = tag_bits
        super().__init__({
            "act": In(stream.Signature(act_layout(config, tag_bits))),
            "wgt": In(stream.Signature(wgt_layout(config))),
            "out": Out(stream.Signature(out_layout(config, tag_bits))),
            "busy": Out(1),
        })

    @property
    def latency(self):
        return array_latency(self.config.rows, self.config.cols)

    def elaborate(self, platform):
        cfg = self.config
        R, C = cfg.rows, cfg.cols
        L = self.latency
        m = Module()

        en = Signal()
        m.d.comb += en.eq(~self.out.valid | self.out.ready)

        # -- weight preload into the PE shadow registers ---------------------------
        shadow_full = Signal()
        drain = Signal(range(R + C + 1))      # cycles until every PE copied the shadow
        wrow = Signal(range(R))
        inject = Signal()                     # a `first` beat enters this cycle
        # wgt.ready = ~shadow_full & (drain == 0), kept in a register of its own (computed
        # from the next values of both) so that the shadow write enables start at a flip-flop
        # (proved on every state: tests/hw/test_retimed_compute.py::test_array_weight_ready_exhaustive)
        w_ready = Signal(init=1)
        sf_next = Signal()
        drain_zero_next = Signal()
        m.d.comb += self.wgt.ready.eq(w_ready)
        with m.If(en & (drain != 0)):
            m.d.sync += drain.eq(drain - 1)
        m.d.comb += [
            sf_next.eq(Mux(inject, 0,
                           shadow_full | (self.wgt.valid & w_ready & (wrow == R - 1)))),
            drain_zero_next.eq(~inject & Mux(en & (drain != 0), drain == 1, drain == 0)),
        ]
        m.d.sync += w_ready.eq(~sf_next & drain_zero_next)
        with m.If(self.wgt.valid & self.wgt.ready):
            m.d.sync += wrow.eq(Const(0) if R == 1 else wrow + 1)
            with m.If(wrow == R - 1):
                m.d.sync += [wrow.eq(0), shadow_full.eq(1)]
        with m.If(inject):
            m.d.sync += [shadow_full.eq(0), drain.eq(R + C)]

        # the shadow writes land a cycle after the handshake, from registers (the data, and
        # one enable per row: the row decode and its fan-out to R x C x weight_bits clock
        # enables spread over the DSP rows were on 7.6 ns paths in the whole design). Safe:
        # row r switches r + 1 cycles after a `first` beat enters, which needs the full
        # flag, set as the last row is taken.
        w_data_q = dreg(self.wgt.p.shape(), name="w_data_q")
        w_we_q = [Signal(name=f"w_we_q{r}") for r in range(R)]
        m.d.sync += w_data_q.eq(self.wgt.p)
        m.d.sync += [w_we_q[r].eq(self.wgt.valid & w_ready & (wrow == r)) for r in range(R)]

        # -- input: accept a row; a `first` row needs a complete shadow tile -----------
        m.d.comb += self.act.ready.eq(en & (~self.act.p.first | shadow_full))
        accept = Signal()
        m.d.comb += [
            accept.eq(self.act.valid & self.act.ready),
            inject.eq(accept & self.act.p.first),
        ]

        # -- skew: row r is delayed by r+1 registers --------------------------------
        a_edge, f_edge = [], []
        for r in range(R):
            a_prev = self.act.p.data[r]
            f_prev = inject
            for i in range(r + 1):
                a_d = dreg(signed(cfg.input_bits), name=f"skew_a_{r}_{i}")
                f_d = Signal(name=f"skew_f_{r}_{i}")
                with m.If(en):
                    m.d.sync += [a_d.eq(a_prev), f_d.eq(f_prev)]
                a_prev, f_prev = a_d, f_d
            a_edge.append(a_prev)
            f_edge.append(f_prev)

        # -- the PE grid -------------------------------------------------------------
        pes = [[None] * C for _ in range(R)]
        for r in range(R):
            for c in range(C):
                pe = ProcessingElement(cfg.input_bits, cfg.weight_bits, psum_bits(cfg, r + 1))
                m.submodules[f"pe_{r}_{c}"] = pe
                pes[r][c] = pe
                m.d.comb += [
                    pe.en.eq(en),
                    pe.w_in.eq(w_data_q[c]),
                    pe.w_we.eq(w_we_q[r]),
                ]
                if c == 0:
                    m.d.comb += [pe.a_in.eq(a_edge[r]), pe.f_in.eq(f_edge[r])]
                else:
                    m.d.comb += [pe.a_in.eq(pes[r][c - 1].a_out),
                                 pe.f_in.eq(pes[r][c - 1].f_out)]
                if r == 0:
                    m.d.comb += pe.psum_in.eq(0)
                else:
                    m.d.comb += pe.psum_in.eq(pes[r - 1][c].psum_out)

        # -- deskew: column c is delayed by C-1-c registers ---------------------------
        for c in range(C):
            prev = pes[R - 1][c].psum_out
            for i in range(C - 1 - c):
                d = dreg(signed(psum_bits(cfg, R)), name=f"deskew_{c}_{i}")
                with m.If(en):
                    m.d.sync += d.eq(prev)
                prev = d
            m.d.comb += self.out.p.data[c].eq(prev)

        # -- valid/tag line of the array's latency -------------------------------------
        vline = [Signal(name=f"vline_{i}") for i in range(L)]
        tline = [dreg(self.tag_bits, name=f"tline_{i}") for i in range(L)] if self.tag_bits else []
        with m.If(en):
            m.d.sync += vline[0].eq(accept)
            for i in range(1, L):
                m.d.sync += vline[i].eq(vline[i - 1])
            if self.tag_bits:
                m.d.sync += tline[0].eq(self.act.p.tag)
                for i in range(1, L):
                    m.d.sync += tline[i].eq(tline[i - 1])
        m.d.comb += self.out.valid.eq(vline[-1])
        if self.tag_bits:
            m.d.comb += self.out.p.tag.eq(tline[-1])

        busy = vline[0]
        for v in vline[1:]:
            busy = busy | v
        m.d.comb += self.busy.eq(busy)
        return m
