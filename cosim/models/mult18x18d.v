// Behavioural simulation model of the Lattice ECP5 MULT18X18D, for the subset dnnfab's
// ECP5 processing element uses (hw/pe.py: _elaborate_ecp5). Written from the sysDSP
// description of the primitive: optional input registers on A and B and an optional
// output register, each clocked by CLK0 with the clock enable and synchronous reset its
// parameter names; SIGNEDA/SIGNEDB select a signed 18x18 multiply; P is 36 bits. Not
// modelled (and not used): the C input, SOURCEA/B shift paths, the pipeline register,
// cascades, asynchronous reset and the other clocks. Yosys ships the primitive only as a
// blackbox, so co-simulation of the ECP5 variant needs this model.
`default_nettype none
module MULT18X18D #(
    parameter REG_INPUTA_CLK = "NONE", parameter REG_INPUTA_CE = "CE0", parameter REG_INPUTA_RST = "RST0",
    parameter REG_INPUTB_CLK = "NONE", parameter REG_INPUTB_CE = "CE0", parameter REG_INPUTB_RST = "RST0",
    parameter REG_INPUTC_CLK = "NONE", parameter REG_INPUTC_CE = "CE0", parameter REG_INPUTC_RST = "RST0",
    parameter REG_PIPELINE_CLK = "NONE", parameter REG_PIPELINE_CE = "CE0", parameter REG_PIPELINE_RST = "RST0",
    parameter REG_OUTPUT_CLK = "NONE", parameter REG_OUTPUT_CE = "CE0", parameter REG_OUTPUT_RST = "RST0",
    parameter CLK0_DIV = "ENABLED", parameter CLK1_DIV = "ENABLED", parameter CLK2_DIV = "ENABLED",
    parameter CLK3_DIV = "ENABLED", parameter HIGHSPEED_CLK = "NONE", parameter GSR = "ENABLED",
    parameter CAS_MATCH_REG = "FALSE", parameter SOURCEB_MODE = "B_SHIFT", parameter MULT_BYPASS = "DISABLED",
    parameter RESETMODE = "SYNC"
) (
    input wire A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0,
    input wire B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0,
    input wire C17, C16, C15, C14, C13, C12, C11, C10, C9, C8, C7, C6, C5, C4, C3, C2, C1, C0,
    input wire SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    input wire CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0, RST3, RST2, RST1, RST0,
    output wire P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20, P19, P18,
    output wire P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2, P1, P0
);
    wire [17:0] a = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0};
    wire [17:0] b = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0};
    wire [3:0] ce = {CE3, CE2, CE1, CE0};
    wire [3:0] rst = {RST3, RST2, RST1, RST0};
    function automatic integer sel(input [8*4-1:0] name);
        sel = (name == "CE0" || name == "RST0") ? 0 : (name == "CE1" || name == "RST1") ? 1 :
              (name == "CE2" || name == "RST2") ? 2 : 3;
    endfunction
    reg [17:0] a_q = 0, b_q = 0;
    reg [35:0] p_q = 0;
    reg sa_q = 0, sb_q = 0;
    wire [17:0] a_v = (REG_INPUTA_CLK == "NONE") ? a : a_q;
    wire [17:0] b_v = (REG_INPUTB_CLK == "NONE") ? b : b_q;
    wire sa = SIGNEDA, sb = SIGNEDB;
    wire signed [36:0] a_x = sa ? {{19{a_v[17]}}, a_v} : {19'b0, a_v};
    wire signed [36:0] b_x = sb ? {{19{b_v[17]}}, b_v} : {19'b0, b_v};
    wire [35:0] p_c = (a_x * b_x);
    always @(posedge CLK0) begin
        if (REG_INPUTA_CLK == "CLK0") begin
            if (rst[sel(REG_INPUTA_RST)]) a_q <= 0; else if (ce[sel(REG_INPUTA_CE)]) a_q <= a;
        end
        if (REG_INPUTB_CLK == "CLK0") begin
            if (rst[sel(REG_INPUTB_RST)]) b_q <= 0; else if (ce[sel(REG_INPUTB_CE)]) b_q <= b;
        end
        if (REG_OUTPUT_CLK == "CLK0") begin
            if (rst[sel(REG_OUTPUT_RST)]) p_q <= 0; else if (ce[sel(REG_OUTPUT_CE)]) p_q <= p_c;
        end
    end
    wire [35:0] p = (REG_OUTPUT_CLK == "NONE") ? p_c : p_q;
    assign {P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20, P19, P18,
            P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3, P2, P1, P0} = p;
endmodule
`default_nettype wire
