// dnnfab_axil_host: an AXI4-Lite master in the simulated Verilog that runs a batch of
// register transactions for the host (cosim/tb_rtl.py, the RTL driver backend): no Python
// per clock cycle of a register access.
//
// Host command: an operation is a 64-bit word: kind[63:60] (1 read, 2 write),
// address[59:32], data[31:0]. Up to P operations go on cmd_ops (operation k in bits
// [64k +: 64]); a longer batch is written to dnnfab_axil_ops.hex in the simulator's working
// directory (one word per line). Set cmd_n (the number of operations), then change
// cmd_seq. At the next rising edge the batch
// is loaded ($readmemh) and busy rises; the operations run one after the other, in order:
// a read drives ARVALID until its handshake and takes the R beat (RREADY held high); a write
// drives AWVALID and WVALID (all strobes) until their handshakes and takes the B response
// (BREADY high). Outputs are registered and change only at rising edges; a valid is held
// until its ready (AXI's rule). After the last response the results are written to
// dnnfab_axil_res.hex ($writememh, one 40-bit word per operation: response[33:32],
// read data[31:0]), busy falls and done_seq = cmd_seq. The next operation starts in the
// cycle its predecessor's response is taken, so back-to-back reads of the dnnfab register
// bank take 2 cycles each (its ARREADY is low while RVALID is high), writes 3. Results: a
// batch of at most P on res_ops (40 bits each: response[33:32], read data[31:0]), a longer
// one in dnnfab_axil_res.hex. A reset drops a pending command (done_seq = cmd_seq).
`default_nettype none
module dnnfab_axil_host #(
    parameter ADDR_W = 12,
    parameter N_LOG2 = 6,
    parameter P = 16
) (
    input  wire              clk,
    input  wire              rst,
    input  wire [7:0]        cmd_seq,
    input  wire [N_LOG2:0]   cmd_n,
    input  wire [64*P-1:0]   cmd_ops,
    output reg  [40*P-1:0]   res_ops,
    output reg  [7:0]        done_seq,
    output reg               busy,
    output reg  [ADDR_W-1:0] awaddr,
    output wire [2:0]        awprot,
    output reg               awvalid,
    input  wire              awready,
    output reg  [31:0]       wdata,
    output wire [3:0]        wstrb,
    output reg               wvalid,
    input  wire              wready,
    input  wire [1:0]        bresp,
    input  wire              bvalid,
    output reg               bready,
    output reg  [ADDR_W-1:0] araddr,
    output wire [2:0]        arprot,
    output reg               arvalid,
    input  wire              arready,
    input  wire [31:0]       rdata,
    input  wire [1:0]        rresp,
    input  wire              rvalid,
    output reg               rready
);
    localparam N = 1 << N_LOG2;
    reg [63:0] ops [0:N-1];
    reg [39:0] res [0:N-1];
    reg [N_LOG2:0] i, n;
    reg is_wr, aw_open, w_open;
    reg [63:0] op;
    reg last;
    reg from_port;
    integer k;

    assign awprot = 3'b000;
    assign arprot = 3'b000;
    assign wstrb = 4'hF;

    always @(posedge clk) begin
        if (rst) begin
            done_seq <= cmd_seq;        // a command pending at reset is dropped, not replayed
            busy <= 1'b0;
            awvalid <= 1'b0;
            wvalid <= 1'b0;
            bready <= 1'b0;
            arvalid <= 1'b0;
            rready <= 1'b0;
            aw_open = 1'b0;
            w_open = 1'b0;
        end else if (!busy) begin
            if (cmd_seq != done_seq) begin
                n = cmd_n;
                from_port = cmd_n <= P;
                if (from_port) begin
                    for (k = 0; k < P; k = k + 1)
                        ops[k] = cmd_ops[64 * k +: 64];
                end else begin
                    $readmemh("dnnfab_axil_ops.hex", ops);
                end
                i = 0;
                begin
                    busy <= 1'b1;
                    op = ops[0];
                    is_wr = op[63:60] == 4'd2;
                    if (is_wr) begin
                        awaddr <= op[32 +: ADDR_W];
                        wdata <= op[31:0];
                        awvalid <= 1'b1;
                        wvalid <= 1'b1;
                        bready <= 1'b1;
                        aw_open = 1'b1;
                        w_open = 1'b1;
                    end else begin
                        araddr <= op[32 +: ADDR_W];
                        arvalid <= 1'b1;
                        rready <= 1'b1;
                    end
                end
            end
        end else begin
            last = 1'b0;
            if (is_wr) begin
                if (awvalid && awready) begin
                    awvalid <= 1'b0;
                    aw_open = 1'b0;
                end
                if (wvalid && wready) begin
                    wvalid <= 1'b0;
                    w_open = 1'b0;
                end
                if (bvalid && bready) begin
                    res[i] = {6'd0, bresp, 32'd0};
                    last = 1'b1;
                end
            end else begin
                if (arvalid && arready)
                    arvalid <= 1'b0;
                if (rvalid && rready) begin
                    res[i] = {6'd0, rresp, rdata};
                    last = 1'b1;
                end
            end
            if (last) begin
                bready <= 1'b0;
                rready <= 1'b0;
                i = i + 1;
                if (i == n) begin
                    if (from_port) begin
                        for (k = 0; k < P; k = k + 1)
                            res_ops[40 * k +: 40] <= (k < n) ? res[k] : 40'd0;
                    end else begin
                        $writememh("dnnfab_axil_res.hex", res, 0, n - 1);
                    end
                    done_seq <= cmd_seq;
                    busy <= 1'b0;           // last: a simulator may report its fall before
                                            // the updates scheduled after it
                end else begin
                    op = ops[i[N_LOG2-1:0]];
                    is_wr = op[63:60] == 4'd2;
                    if (is_wr) begin
                        awaddr <= op[32 +: ADDR_W];
                        wdata <= op[31:0];
                        awvalid <= 1'b1;
                        wvalid <= 1'b1;
                        bready <= 1'b1;
                        aw_open = 1'b1;
                        w_open = 1'b1;
                    end else begin
                        araddr <= op[32 +: ADDR_W];
                        arvalid <= 1'b1;
                        rready <= 1'b1;
                    end
                end
            end
        end
    end
endmodule
`default_nettype wire
