"""Processing element of the weight-stationary systolic array."""

from amaranth.hdl import Signal, Module, Const, Instance, ClockSignal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["ProcessingElement", "registered_mul", "mult18x18d", "MUL_LATENCY", "dreg"]

#: Cycles from the operands of :func:`registered_mul` to its product.
from .spec import MUL_LATENCY


def dreg(shape=1, name=None):
    """A datapath register: a Signal without reset (``reset_less``).

    Only control state (valid bits, flags, counters, FSM states) is reset. Data registers
    whose contents are only read when a reset control bit says they are valid need no
    reset, and leaving it off matters on an FPGA: in the 8x8 accelerator 15k of 17.6k
    flip-flops shared one reset net (``rst | SOFT_RESET``), routed through the general
    fabric to every corner of the die, and each reset flip-flop constrains how slices
    pack. Such a register keeps its ``init`` value at configuration and in simulation.
    """
    return Signal(shape, name=name, reset_less=True, src_loc_at=1)


def mult18x18d(a, b, p, *, ce_a=Const(1), ce_b=None, rst=Const(0)):
    """An ECP5 ``MULT18X18D`` computing ``p = a * b`` (18-bit signed operands, 36-bit
    product) with its A input, B input and output registers on ``CLK0``: A and the output
    register load on ``ce_a``, B on ``ce_b`` (default: ``ce_a``); all three reset synchronously on ``rst``. Returns the ``Instance``."""
    ports = {}
    for i in range(18):
        ports[f"i_A{i}"] = a[i]
        ports[f"i_B{i}"] = b[i]
        ports[f"i_C{i}"] = Const(0)
    for i in range(36):
        ports[f"o_P{i}"] = p[i]
    separate_b = ce_b is not None
    return Instance(
        "MULT18X18D",
        p_REG_INPUTA_CLK="CLK0", p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK="CLK0", p_REG_INPUTB_CE="CE1" if separate_b else "CE0",
        p_REG_INPUTB_RST="RST0",
        p_REG_INPUTC_CLK="NONE", p_REG_PIPELINE_CLK="NONE", p_REG_OUTPUT_CLK="CLK0",
        p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_CLK0_DIV="ENABLED", p_CLK1_DIV="ENABLED", p_CLK2_DIV="ENABLED", p_CLK3_DIV="ENABLED",
        p_HIGHSPEED_CLK="NONE", p_GSR="DISABLED", p_CAS_MATCH_REG="FALSE",
        p_SOURCEB_MODE="B_SHIFT", p_MULT_BYPASS="DISABLED", p_RESETMODE="SYNC",
        i_SIGNEDA=Const(1), i_SIGNEDB=Const(1), i_SOURCEA=Const(0), i_SOURCEB=Const(0),
        i_CLK0=ClockSignal(), i_CLK1=Const(0), i_CLK2=Const(0), i_CLK3=Const(0),
        i_CE0=ce_a, i_CE1=ce_b if separate_b else Const(0),
        i_CE2=Const(0), i_CE3=Const(0),
        i_RST0=rst, i_RST1=Const(0), i_RST2=Const(0), i_RST3=Const(0),
        **ports)


def registered_mul(m, platform, a, b, name):
    """``a * b`` (signed or unsigned Values of at most 18 bits with their sign bit) with
    the operands and the product registered: the product appears ``MUL_LATENCY`` = 2 cycles
    after the operands (no enable, no reset: the registers just follow the operands).

    On ECP5 (``platform.dnnfab_mult == "ecp5"``) this is one ``MULT18X18D`` with its A/B
    input registers and its output register in use, so neither the route into nor out of
    the DSP column shares a cycle with the multiplier (a combinational ``MULT18X18D`` costs
    about 4 ns plus both routes). Elsewhere it is the same pipeline in plain logic.
    Returns a ``signed(36)`` Signal.
    """
    a = a.as_signed() if a.shape().signed else a.as_unsigned()
    b = b.as_signed() if b.shape().signed else b.as_unsigned()
    assert len(a) + (0 if a.shape().signed else 1) <= 18, a
    assert len(b) + (0 if b.shape().signed else 1) <= 18, b
    if getattr(platform, "dnnfab_mult", None) == "ecp5":
        p = Signal(signed(36), name=f"{name}_p")
        a_ext = Signal(signed(18), name=f"{name}_a")
        b_ext = Signal(signed(18), name=f"{name}_b")
        m.d.comb += [a_ext.eq(a), b_ext.eq(b)]
        m.submodules[f"{name}_mult"] = mult18x18d(a_ext, b_ext, p)
    else:
        a_q = dreg(signed(18), name=f"{name}_aq")
        b_q = dreg(signed(18), name=f"{name}_bq")
        p = dreg(signed(36), name=f"{name}_p")
        m.d.sync += [a_q.eq(a), b_q.eq(b), p.eq(a_q * b_q)]
    return p


class ProcessingElement(wiring.Component):
    """One multiply-accumulate cell with a double-buffered (shadow/active) weight.

    Activations travel left to right, partial sums top to bottom. A new weight is written
    into the *shadow* register while the *active* one is in use; the activation that
    starts a new tile carries ``first`` and, as it enters the PE, copies shadow into
    active. Because ``first`` travels with the skewed data, every PE switches exactly
    when the new tile reaches it and tiles follow each other with no bubble.

    Pipeline (all registers advance only while ``en`` is high, the array's global stall):
    ``a_in -> a_reg -> prod = a_reg * w_act -> prod_q -> psum_out = psum_in + prod_q``.
    The product register lets the multiplier map onto a DSP block with registered
    inputs and outputs; ``prod_q`` takes the product out of the DSP block into the
    fabric, so the partial-sum adder starts at a flip-flop beside it.

    Parameters
    ----------
    input_bits, weight_bits, acc_bits : int
        Signed widths of activation, weight and partial sum.

    Members
    -------
    en : ``In(1)``
        Pipeline advance (global clock enable of the array).
    a_in : ``In(signed(input_bits))``
        Activation from the left neighbour (or the skew line).
    f_in : ``In(1)``
        ``a_in`` is the first activation of a new weight tile.
    a_out : ``Out(signed(input_bits))``
        Registered activation to the right neighbour.
    f_out : ``Out(1)``
        Registered ``f_in`` to the right neighbour.
    w_in : ``In(signed(weight_bits))``
        Weight to store in the shadow register ...
    w_we : ``In(1)``
        ... when this is high (independent of ``en``).
    psum_in : ``In(signed(acc_bits))``
        Partial sum from the PE above (zero at the top row).
    psum_out : ``Out(signed(acc_bits))``
        ``psum_in + a * w``, registered, to the PE below.
    """

    def __init__(self, input_bits=8, weight_bits=8, acc_bits=32):
        self.input_bits = input_bits
        self.weight_bits = weight_bits
        self.acc_bits = acc_bits
        super().__init__({
            "en": In(1),
            "a_in": In(signed(input_bits)),
            "f_in": In(1),
            "a_out": Out(signed(input_bits)),
            "f_out": Out(1),
            "w_in": In(signed(weight_bits)),
            "w_we": In(1),
            "psum_in": In(signed(acc_bits)),
            "psum_out": Out(signed(acc_bits)),
        })

    def elaborate(self, platform):
        if getattr(platform, "dnnfab_mult", None) == "ecp5":
            return self._elaborate_ecp5()
        m = Module()
        # data registers have no reset (only ``f_out`` is control): see :func:`dreg`
        w_shadow = dreg(signed(self.weight_bits))
        w_active = dreg(signed(self.weight_bits))
        prod = dreg(signed(self.input_bits + self.weight_bits))
        prod_q = dreg(signed(self.input_bits + self.weight_bits), name="prod_q")
        a_q = dreg(signed(self.input_bits), name="a_q")
        psum_q = dreg(signed(self.acc_bits), name="psum_q")
        m.d.comb += [self.a_out.eq(a_q), self.psum_out.eq(psum_q)]

        with m.If(self.w_we):
            m.d.sync += w_shadow.eq(self.w_in)
        with m.If(self.en):
            m.d.sync += [
                a_q.eq(self.a_in),
                self.f_out.eq(self.f_in),
                prod.eq(a_q * w_active),
                prod_q.eq(prod),
                psum_q.eq(self.psum_in + prod_q),
            ]
            with m.If(self.f_in):
                m.d.sync += w_active.eq(w_shadow)
        return m

    def _elaborate_ecp5(self):
        """The same PE with its product registers inside an ECP5 ``MULT18X18D``.

        Selected by synthesis for ECP5 parts (``platform.dnnfab_mult == "ecp5"``): yosys does
        not pack the registers around a multiplier into the DSP block, and the route into and
        out of the DSP column then limits Fmax. Register for register this is the behavioural
        PE: input A register = ``a_out`` (loaded on ``en``), input B register = ``w_active``
        (loaded from the shadow on ``en & f_in``), output register = ``prod`` (on ``en``).
        ``tests/cosim/test_pe_ecp5.py`` runs the array built this way, with yosys' simulation
        model of the primitive, against numpy.
        """
        assert self.input_bits <= 18 and self.weight_bits <= 18
        m = Module()
        w_shadow = dreg(signed(self.weight_bits))
        prod = Signal(signed(self.input_bits + self.weight_bits))
        P = Signal(36)
        a_ext = Signal(18)
        b_ext = Signal(18)
        a_q = dreg(signed(self.input_bits), name="a_q")
        psum_q = dreg(signed(self.acc_bits), name="psum_q")
        m.d.comb += [self.a_out.eq(a_q), self.psum_out.eq(psum_q)]
        m.d.comb += [a_ext.eq(self.a_in.as_signed()), b_ext.eq(w_shadow.as_signed())]
        with m.If(self.w_we):
            m.d.sync += w_shadow.eq(self.w_in)
        # A register = a_out (on en), B register = w_active (on en & f_in), output = prod
        # (no reset on the DSP registers either: data, like a_q and psum_q)
        m.submodules.mult = mult18x18d(a_ext, b_ext, P, ce_a=self.en, ce_b=self.en & self.f_in)
        m.d.comb += prod.eq(P[:len(prod)])
        # the product once more in the fabric (``prod_q``), so the partial-sum adder starts
        # at a flip-flop beside it, not at the DSP block's output across the column (the
        # array's partial-sum chains were the whole design's most numerous late endpoints)
        prod_q = dreg(signed(self.input_bits + self.weight_bits), name="prod_q")
        with m.If(self.en):
            m.d.sync += [
                a_q.eq(self.a_in),
                self.f_out.eq(self.f_in),
                prod_q.eq(prod),
                psum_q.eq(self.psum_in + prod_q),
            ]
        return m
