// Behavioural simulation model of the Lattice ECP5 TRELLIS_FF flip-flop, for the subset
// dnnfab uses (hw/scratchpad.py, dup_reg): rising-edge clock, clock enable tied high
// (CEMUX "1"), no set/reset in use (LSR tied low). Yosys ships the primitive only as a
// blackbox.
`default_nettype none
module TRELLIS_FF #(
    parameter GSR = "ENABLED", parameter CEMUX = "1", parameter CLKMUX = "CLK",
    parameter LSRMUX = "LSR", parameter SRMODE = "LSR_OVER_CE", parameter REGSET = "RESET",
    parameter REGMODE = "FF", parameter LSRMODE = "LSR"
) (
    input wire CLK, input wire LSR, input wire CE, input wire DI, input wire M,
    output reg Q
);
    initial Q = (REGSET == "SET");
    always @(posedge CLK) begin
        if (LSR) Q <= (REGSET == "SET");
        else Q <= DI;
    end
endmodule
