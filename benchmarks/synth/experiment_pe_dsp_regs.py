"""Experiment: PE with the multiplier's input/output registers inside MULT18X18D."""
import sys, json
from amaranth.hdl import Signal, Module, signed, Instance, Const, Cat, ClockSignal
import dnnfab.hw.pe as pe_mod

def elaborate(self, platform):
    m = Module()
    w_shadow = Signal(signed(self.weight_bits))
    prod = Signal(signed(self.input_bits + self.weight_bits))
    P = Signal(36)
    a_ext = Signal(18); b_ext = Signal(18)
    m.d.comb += [a_ext.eq(self.a_in.as_signed()), b_ext.eq(w_shadow.as_signed())]
    with m.If(self.w_we):
        m.d.sync += w_shadow.eq(self.w_in)
    ports = {}
    for i in range(18):
        ports[f"i_A{i}"] = a_ext[i]; ports[f"i_B{i}"] = b_ext[i]; ports[f"i_C{i}"] = Const(0)
    for i in range(36):
        ports[f"o_P{i}"] = P[i]
    m.submodules.mult = Instance("MULT18X18D",
        p_REG_INPUTA_CLK="CLK0", p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK="CLK0", p_REG_INPUTB_CE="CE1", p_REG_INPUTB_RST="RST0",
        p_REG_INPUTC_CLK="NONE", p_REG_PIPELINE_CLK="NONE", p_REG_OUTPUT_CLK="CLK0",
        p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_CLK0_DIV="ENABLED", p_CLK1_DIV="ENABLED", p_CLK2_DIV="ENABLED", p_CLK3_DIV="ENABLED",
        p_HIGHSPEED_CLK="NONE", p_GSR="DISABLED", p_CAS_MATCH_REG="FALSE",
        p_SOURCEB_MODE="B_SHIFT", p_MULT_BYPASS="DISABLED", p_RESETMODE="SYNC",
        i_SIGNEDA=Const(1), i_SIGNEDB=Const(1), i_SOURCEA=Const(0), i_SOURCEB=Const(0),
        i_CLK0=ClockSignal(), i_CLK1=Const(0), i_CLK2=Const(0), i_CLK3=Const(0),
        i_CE0=self.en, i_CE1=self.en & self.f_in, i_CE2=Const(0), i_CE3=Const(0),
        i_RST0=Const(0), i_RST1=Const(0), i_RST2=Const(0), i_RST3=Const(0),
        **ports)
    m.d.comb += prod.eq(P[:len(prod)])
    with m.If(self.en):
        m.d.sync += [
            self.a_out.eq(self.a_in),
            self.f_out.eq(self.f_in),
            self.psum_out.eq(self.psum_in + prod),
        ]
    return m

pe_mod.ProcessingElement.elaborate = elaborate
from dnnfab.boards.synth import synthesize
from dnnfab.hw.config import AcceleratorConfig
R = int(sys.argv[1])
r = synthesize(AcceleratorConfig(rows=R, cols=R, clock_mhz=150), 'ulx3s-85f', 'array', progress=print, check=False)
r.pop('primitives'); r.pop('config'); print(json.dumps(r))
