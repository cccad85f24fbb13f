// Behavioural simulation model of the Lattice ECP5 DP16KD block RAM, for the subset
// dnnfab's RegisteredRAM (hw/scratchpad.py) uses: port A writes, port B reads, both on
// one clock, no chip selects, no resets, WRITEMODE NORMAL. Written from the ECP5 sysMEM
// description (TN1264): 16 Kib per block; in xN mode (N = 1, 2, 4, 9, 18) the word address
// is AD[13:14-log2(16K/N)], and in x18 mode AD[1:0] are the write byte enables (9 bits
// each). DATA_WIDTH 36 on both ports is the pseudo dual-port mode (PDPW16KD, wired as
// yosys' brams_map_16kd.v does): 512 words written from {DIB, DIA} at ADA[13:5] with the
// byte enables ADA[3:0], read at ADB[13:5] onto {DOB, DOA}. REGMODE "OUTREG" adds the
// output register (clocked, enabled by OCE) behind the read latch (enabled by CE).
// Yosys ships the primitive only as a blackbox.
`default_nettype none
module DP16KD #(
    parameter DATA_WIDTH_A = 18, parameter DATA_WIDTH_B = 18,
    parameter REGMODE_A = "NOREG", parameter REGMODE_B = "NOREG",
    parameter RESETMODE = "SYNC", parameter ASYNC_RESET_RELEASE = "SYNC",
    parameter CSDECODE_A = "0b000", parameter CSDECODE_B = "0b000",
    parameter WRITEMODE_A = "NORMAL", parameter WRITEMODE_B = "NORMAL", parameter GSR = "ENABLED"
) (
    input wire DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0,
    input wire ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0,
    input wire CEA, OCEA, CLKA, WEA, RSTA, CSA2, CSA1, CSA0,
    input wire DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0,
    input wire ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0,
    input wire CEB, OCEB, CLKB, WEB, RSTB, CSB2, CSB1, CSB0,
    output wire DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0,
    output wire DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0
);
    wire [17:0] dia = {DIA17, DIA16, DIA15, DIA14, DIA13, DIA12, DIA11, DIA10, DIA9, DIA8, DIA7, DIA6, DIA5, DIA4, DIA3, DIA2, DIA1, DIA0};
    wire [13:0] ada = {ADA13, ADA12, ADA11, ADA10, ADA9, ADA8, ADA7, ADA6, ADA5, ADA4, ADA3, ADA2, ADA1, ADA0};
    wire [13:0] adb = {ADB13, ADB12, ADB11, ADB10, ADB9, ADB8, ADB7, ADB6, ADB5, ADB4, ADB3, ADB2, ADB1, ADB0};
    wire [17:0] dib = {DIB17, DIB16, DIB15, DIB14, DIB13, DIB12, DIB11, DIB10, DIB9, DIB8, DIB7, DIB6, DIB5, DIB4, DIB3, DIB2, DIB1, DIB0};
    localparam integer SA = DATA_WIDTH_A == 36 ? 5 : DATA_WIDTH_A == 18 ? 4 : DATA_WIDTH_A == 9 ? 3 : DATA_WIDTH_A == 4 ? 2 : DATA_WIDTH_A == 2 ? 1 : 0;
    localparam integer SB = DATA_WIDTH_B == 36 ? 5 : DATA_WIDTH_B == 18 ? 4 : DATA_WIDTH_B == 9 ? 3 : DATA_WIDTH_B == 4 ? 2 : DATA_WIDTH_B == 2 ? 1 : 0;
    // this model supports equal port widths only (all RegisteredRAM needs)
    reg [17:0] mem [0:16383];
    reg [35:0] mem36 [0:511];
    reg [35:0] latch_b = 0, out_b = 0;
    wire [13:0] wa = ada >> SA;
    wire [13:0] ra = adb >> SB;
    integer i;
    initial begin
        if (DATA_WIDTH_A != DATA_WIDTH_B) begin
            $display("DP16KD model: port widths must match"); $finish;
        end
        for (i = 0; i < 16384; i = i + 1) mem[i] = 18'h0;
        for (i = 0; i < 512; i = i + 1) mem36[i] = 36'h0;
    end
    always @(posedge CLKA) begin
        if (CEA && WEA) begin
            if (DATA_WIDTH_A == 36) begin
                if (ada[0]) mem36[wa][8:0] <= dia[8:0];
                if (ada[1]) mem36[wa][17:9] <= dia[17:9];
                if (ada[2]) mem36[wa][26:18] <= dib[8:0];
                if (ada[3]) mem36[wa][35:27] <= dib[17:9];
            end else if (DATA_WIDTH_A == 18) begin
                if (ada[0]) mem[wa][8:0] <= dia[8:0];
                if (ada[1]) mem[wa][17:9] <= dia[17:9];
            end else begin
                mem[wa] <= dia & ((18'h1 << DATA_WIDTH_A) - 1);
            end
        end
    end
    always @(posedge CLKB) begin
        if (CEB) latch_b <= (DATA_WIDTH_B == 36) ? mem36[ra] : {18'h0, mem[ra] & ((18'h1 << DATA_WIDTH_B) - 1)};
        if (OCEB) out_b <= latch_b;
    end
    wire [35:0] rd = (REGMODE_B == "OUTREG") ? out_b : latch_b;
    wire [17:0] dob = (DATA_WIDTH_B == 36) ? rd[35:18] : rd[17:0];
    wire [17:0] doa = (DATA_WIDTH_B == 36) ? rd[17:0] : 18'h0;
    assign {DOB17, DOB16, DOB15, DOB14, DOB13, DOB12, DOB11, DOB10, DOB9, DOB8, DOB7, DOB6, DOB5, DOB4, DOB3, DOB2, DOB1, DOB0} = dob;
    assign {DOA17, DOA16, DOA15, DOA14, DOA13, DOA12, DOA11, DOA10, DOA9, DOA8, DOA7, DOA6, DOA5, DOA4, DOA3, DOA2, DOA1, DOA0} = doa;
endmodule
