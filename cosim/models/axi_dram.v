// dnnfab_axi_dram: an AXI4 slave memory that lives in the simulated Verilog (co-simulation
// DRAM). It replaces cocotbext-axi's AxiRam in the accelerator testbench: same behaviour
// cycle for cycle (see docs/cosim_dram.md), no Python per AXI beat.
//
// Cycle model. AxiRam is five cocotb stream endpoints (AR, AW, W sinks and R, B sources,
// each with a queue of at most 2 entries) and two processes (read, write) that move items
// between the queues. At a clock edge the endpoints run first, on the values before the
// edge (they sample valid/ready, push or pop one item and drive the next outputs); the
// processes are woken by those pushes and pops and run after them in the same time step,
// as far as the queues let them. Here, one clocked block does the same in that order with
// blocking temporaries: a sink's ready is "fewer than 2 items queued" counted after its
// push and before the process's pops of the same edge; a source drives the head of its
// queue as it was before the process's pushes of that edge. Consequences (as AxiRam):
//   * first R beat 2 cycles after the AR handshake, then one beat per cycle, bursts back
//     to back; ARs accepted every cycle until two wait behind the current burst;
//   * W accepted every cycle while an AW is open (two W beats may run ahead of the AW);
//     B valid the cycle after the burst's last W handshake;
//   * memory is read for a beat as soon as the previous beat entered the R queue (the
//     read process then waits for room with the beat in hand), up to 3 cycles before
//     the beat is driven; it is written when a W beat leaves the W queue; in one time
//     step the read process runs before the write process (a read racing a write to
//     the same word sees the old data). All of it checked against AxiRam on random
//     traffic, every cycle (cosim/tb_dram.py).
//
// AXI rules checked (sticky bits of prot_err, first address in prot_err_addr, a
// $display naming the violation; a burst breaking one of rules 0-7 is answered SLVERR):
//   0/1  AR/AW INCR burst crosses a 4 KiB boundary      2/3  AR/AW burst type not INCR
//   4/5  AR/AW longer than MAX_BURST beats              6/7  AR/AW size wider than the bus
//   8    WLAST not on the burst's last beat
//   9/10/11  AR/AW/W valid dropped or payload changed while waiting for ready
// Addresses wrap modulo the memory size (mask + 1 words), as AxiRam's `address % size`.
//
// Error injection (run-time inputs, counted from reset; see inj_en):
//   bit 0: every read beat of word address inj_rd_addr answers SLVERR (data 0)
//   bit 1: read beat number inj_rd_beat (0-based count of all read beats) answers SLVERR
//   bit 2: a write beat of word address inj_wr_addr is not written, its burst answers SLVERR
//   bit 3: write burst number inj_wr_burst (0-based count of AWs) writes nothing, answers SLVERR
//   (a write fault, as AxiRam's write hook raising, needs a beat with strobes: a beat
//   without strobes writes nothing and cannot fail)
//
// Host commands (testbench): set cmd_op/cmd_lo/cmd_hi/cmd_byte, then change cmd_seq; the
// command runs at the next rising edge, cmd_done = cmd_seq afterwards. Word ranges
// [cmd_lo, cmd_hi).
//   1 LOAD   $readmemh("dnnfab_dram_load.hex") (word lines, @ word addresses) in the cwd
//   2 DUMP   $writememh("dnnfab_dram_dump.hex", words [lo, hi))
//   3 FILL   every byte of words [lo, hi) = cmd_byte
//   4 CHECK  cmd_result = number of words in [lo, hi) not all cmd_byte, cmd_first = first
//   5 CLEAR  clear prot_err / prot_err_addr
`default_nettype none
module dnnfab_axi_dram #(
    parameter ADDR_W = 32,
    parameter DATA_W = 128,
    parameter ID_W = 4,
    parameter MAX_BURST = 256,
    parameter WORDS_LOG2 = 20
) (
    input  wire                  clk,
    input  wire                  rst,
    // AXI4 slave: write address, data, response
    input  wire [ID_W-1:0]       awid,
    input  wire [ADDR_W-1:0]     awaddr,
    input  wire [7:0]            awlen,
    input  wire [2:0]            awsize,
    input  wire [1:0]            awburst,
    input  wire                  awvalid,
    output reg                   awready,
    input  wire [DATA_W-1:0]     wdata,
    input  wire [DATA_W/8-1:0]   wstrb,
    input  wire                  wlast,
    input  wire                  wvalid,
    output reg                   wready,
    output reg  [ID_W-1:0]       bid,
    output reg  [1:0]            bresp,
    output reg                   bvalid,
    input  wire                  bready,
    // read address, data
    input  wire [ID_W-1:0]       arid,
    input  wire [ADDR_W-1:0]     araddr,
    input  wire [7:0]            arlen,
    input  wire [2:0]            arsize,
    input  wire [1:0]            arburst,
    input  wire                  arvalid,
    output reg                   arready,
    output reg  [ID_W-1:0]       rid,
    output reg  [DATA_W-1:0]     rdata,
    output reg  [1:0]            rresp,
    output reg                   rlast,
    output reg                   rvalid,
    input  wire                  rready,
    // host side
    input  wire [WORDS_LOG2-1:0] mask,          // memory words - 1 (a power of two - 1)
    input  wire [7:0]            cmd_seq,
    input  wire [2:0]            cmd_op,
    input  wire [WORDS_LOG2:0]   cmd_lo,
    input  wire [WORDS_LOG2:0]   cmd_hi,
    input  wire [7:0]            cmd_byte,
    output reg  [7:0]            cmd_done,
    output reg  [31:0]           cmd_result,
    output reg  [WORDS_LOG2:0]   cmd_first,
    input  wire [3:0]            inj_en,
    input  wire [ADDR_W-1:0]     inj_rd_addr,
    input  wire [31:0]           inj_rd_beat,
    input  wire [ADDR_W-1:0]     inj_wr_addr,
    input  wire [31:0]           inj_wr_burst,
    output reg  [31:0]           rd_beats,      // read beats served (entered the R queue)
    output reg  [31:0]           rd_bursts,     // ARs taken by the read process
    output reg  [31:0]           wr_beats,      // W beats consumed
    output reg  [31:0]           wr_bursts,     // AWs taken by the write process
    output reg  [15:0]           prot_err,
    output reg  [ADDR_W-1:0]     prot_err_addr
);
    localparam BYTES = DATA_W / 8;
    localparam LB = $clog2(BYTES);
    localparam WORDS = 1 << WORDS_LOG2;
    localparam [1:0] OKAY = 2'd0, SLVERR = 2'd2;

    reg [DATA_W-1:0] mem [0:WORDS-1];

    // ---- queues (2 entries, index 0 = head) ----
    reg [ID_W-1:0]   arq_id [0:1];
    reg [ADDR_W-1:0] arq_addr [0:1];
    reg [7:0]        arq_len [0:1];
    reg [2:0]        arq_size [0:1];
    reg [1:0]        arq_burst [0:1];
    reg [1:0]        arq_n;
    reg [ID_W-1:0]   awq_id [0:1];
    reg [ADDR_W-1:0] awq_addr [0:1];
    reg [7:0]        awq_len [0:1];
    reg [2:0]        awq_size [0:1];
    reg [1:0]        awq_burst [0:1];
    reg [1:0]        awq_n;
    reg [DATA_W-1:0] wq_data [0:1];
    reg [BYTES-1:0]  wq_strb [0:1];
    reg              wq_last [0:1];
    reg [1:0]        wq_n;
    reg [DATA_W-1:0] rq_data [0:1];
    reg [ID_W-1:0]   rq_id [0:1];
    reg [1:0]        rq_resp [0:1];
    reg              rq_last [0:1];
    reg [1:0]        rq_n;
    reg [ID_W-1:0]   bq_id [0:1];
    reg [1:0]        bq_resp [0:1];
    reg [1:0]        bq_n;

    // ---- read process: the burst it is serving ----
    reg              pr_act;
    reg [ID_W-1:0]   pr_id;
    reg [ADDR_W-1:0] pr_addr;      // byte address of the next beat
    reg [2:0]        pr_size;
    reg [8:0]        pr_left;      // beats still to enter the R queue
    reg [1:0]        pr_resp;      // burst-level response (SLVERR after a rule violation)
    reg              pr_hold;      // a beat read from memory, waiting for room in the R queue
    reg [DATA_W-1:0] pr_data;
    reg [1:0]        pr_bresp;
    reg              pr_last;
    // ---- write process ----
    reg              pw_act;
    reg [ID_W-1:0]   pw_id;
    reg [ADDR_W-1:0] pw_addr;
    reg [2:0]        pw_size;
    reg [8:0]        pw_left;
    reg [1:0]        pw_resp;
    reg              pw_drop;      // burst injected: write nothing
    reg              pw_bwait;     // B ready to send, B queue full
    // ---- handshake stability checks ----
    reg              ar_wait, aw_wait, w_wait;
    reg [ADDR_W+ID_W+12:0]   ar_hold, aw_hold;
    reg [DATA_W+BYTES:0]     w_hold;

    // temporaries of one edge
    reg [WORDS_LOG2-1:0] widx;
    reg [DATA_W-1:0] bitmask;
    reg [1:0] t_resp;
    reg [3:0] rules;
    reg [15:0] viol;
    reg busy;
    reg [31:0] cnt;
    reg [WORDS_LOG2:0] k;
    integer i, it;

    // violations of one AR/AW: bit 0 4 KiB, bit 1 type, bit 2 length, bit 3 size
    function [3:0] burst_rules(input [ADDR_W-1:0] addr, input [7:0] len, input [2:0] size,
                               input [1:0] burst);
        reg [11:0] al;
        reg [20:0] total, room;
        begin
            al = (addr[11:0] >> size) << size;
            total = ({13'd0, len} + 21'd1) << size;
            room = 21'h1000 - {9'd0, al};
            burst_rules[0] = (burst == 2'd1) && (total > room);     // AxiRam: 0x1000 - (addr & 0xfff) >= bytes
            burst_rules[1] = burst != 2'd1;
            burst_rules[2] = ({1'b0, len} + 9'd1) > MAX_BURST;
            burst_rules[3] = (32'd1 << size) > BYTES;
        end
    endfunction

    function [WORDS_LOG2-1:0] word(input [ADDR_W-1:0] addr);
        reg [63:0] w;
        begin
            w = {{(64 - ADDR_W){1'b0}}, addr} >> LB;
            word = w[WORDS_LOG2-1:0] & mask;
        end
    endfunction

    task violate(input integer bit_no, input [ADDR_W-1:0] addr);
        begin
            if (prot_err == 16'd0 && viol == 16'd0) prot_err_addr = addr;
            viol[bit_no] = 1'b1;
            $display("dnnfab_axi_dram: AXI rule violated at %0t: %0s, address 0x%0h", $time,
                     bit_no == 0 ? "AR burst crosses a 4 KiB boundary" :
                     bit_no == 1 ? "AW burst crosses a 4 KiB boundary" :
                     bit_no == 2 ? "AR burst type is not INCR" :
                     bit_no == 3 ? "AW burst type is not INCR" :
                     bit_no == 4 ? "AR burst longer than MAX_BURST" :
                     bit_no == 5 ? "AW burst longer than MAX_BURST" :
                     bit_no == 6 ? "AR size wider than the bus" :
                     bit_no == 7 ? "AW size wider than the bus" :
                     bit_no == 8 ? "WLAST not on the last beat of the burst" :
                     bit_no == 9 ? "ARVALID dropped or AR changed before ARREADY" :
                     bit_no == 10 ? "AWVALID dropped or AW changed before AWREADY" :
                                    "WVALID dropped or W changed before WREADY", addr);
        end
    endtask

    // defined outputs from time 0 (a 4-state simulator would otherwise hand X to the
    // master's registers before the first reset edge), as AxiRam's initial values
    initial begin
        awready = 1'b0; wready = 1'b0; arready = 1'b0;
        bvalid = 1'b0; bid = {ID_W{1'b0}}; bresp = OKAY;
        rvalid = 1'b0; rid = {ID_W{1'b0}}; rresp = OKAY; rlast = 1'b0; rdata = {DATA_W{1'b0}};
        cmd_done = 8'd0; cmd_result = 32'd0; cmd_first = {(WORDS_LOG2 + 1){1'b0}};
        rd_beats = 32'd0; rd_bursts = 32'd0; wr_beats = 32'd0; wr_bursts = 32'd0;
        prot_err = 16'd0; prot_err_addr = {ADDR_W{1'b0}};
    end

    // Only this block reads its state, so the state is assigned with blocking assignments
    // (in the order the cocotb tasks run); the AXI outputs the DUT samples are nonblocking.
    always @(posedge clk) begin
        viol = 16'd0;
        if (rst) begin
            arready <= 1'b0; awready <= 1'b0; wready <= 1'b0;
            rvalid <= 1'b0; bvalid <= 1'b0;
            arq_n = 2'd0; awq_n = 2'd0; wq_n = 2'd0; rq_n = 2'd0; bq_n = 2'd0;
            pr_act = 1'b0; pr_hold = 1'b0; pw_act = 1'b0; pw_bwait = 1'b0;
            ar_wait = 1'b0; aw_wait = 1'b0; w_wait = 1'b0;
            rd_beats = 32'd0; rd_bursts = 32'd0; wr_beats = 32'd0; wr_bursts = 32'd0;
            prot_err = 16'd0; prot_err_addr = {ADDR_W{1'b0}};
            cmd_done = cmd_seq;
        end else begin
            // ================= endpoints (values before the edge) =================
            // the master keeps valid and the payload until ready
            if (ar_wait && (!arvalid || ar_hold != {arid, araddr, arlen, arsize, arburst}))
                violate(9, araddr);
            if (aw_wait && (!awvalid || aw_hold != {awid, awaddr, awlen, awsize, awburst}))
                violate(10, awaddr);
            if (w_wait && (!wvalid || w_hold != {wdata, wstrb, wlast}))
                violate(11, {ADDR_W{1'b0}});
            ar_wait = arvalid && !arready;
            aw_wait = awvalid && !awready;
            w_wait = wvalid && !wready;
            if (ar_wait) ar_hold = {arid, araddr, arlen, arsize, arburst};
            if (aw_wait) aw_hold = {awid, awaddr, awlen, awsize, awburst};
            if (w_wait) w_hold = {wdata, wstrb, wlast};

            // AR sink: take the beat, then ready = fewer than 2 queued (before the process)
            if (arvalid && arready) begin
                arq_id[arq_n[0]] = arid; arq_addr[arq_n[0]] = araddr; arq_len[arq_n[0]] = arlen;
                arq_size[arq_n[0]] = arsize; arq_burst[arq_n[0]] = arburst;
                arq_n = arq_n + 2'd1;
            end
            arready <= arq_n < 2'd2;
            // AW sink
            if (awvalid && awready) begin
                awq_id[awq_n[0]] = awid; awq_addr[awq_n[0]] = awaddr; awq_len[awq_n[0]] = awlen;
                awq_size[awq_n[0]] = awsize; awq_burst[awq_n[0]] = awburst;
                awq_n = awq_n + 2'd1;
            end
            awready <= awq_n < 2'd2;
            // W sink
            if (wvalid && wready) begin
                wq_data[wq_n[0]] = wdata; wq_strb[wq_n[0]] = wstrb; wq_last[wq_n[0]] = wlast;
                wq_n = wq_n + 2'd1;
            end
            wready <= wq_n < 2'd2;
            // R source: after a handshake or while idle, drive the queue's head (as it was
            // before the read process's pushes of this edge)
            if ((rready && rvalid) || !rvalid) begin
                if (rq_n != 2'd0) begin
                    rdata <= rq_data[0]; rid <= rq_id[0]; rresp <= rq_resp[0]; rlast <= rq_last[0];
                    rvalid <= 1'b1;
                    rq_data[0] = rq_data[1]; rq_id[0] = rq_id[1]; rq_resp[0] = rq_resp[1];
                    rq_last[0] = rq_last[1];
                    rq_n = rq_n - 2'd1;
                end else begin
                    rvalid <= 1'b0;
                end
            end
            // B source
            if ((bready && bvalid) || !bvalid) begin
                if (bq_n != 2'd0) begin
                    bid <= bq_id[0]; bresp <= bq_resp[0];
                    bvalid <= 1'b1;
                    bq_id[0] = bq_id[1]; bq_resp[0] = bq_resp[1];
                    bq_n = bq_n - 2'd1;
                end else begin
                    bvalid <= 1'b0;
                end
            end

            // ================= read process =================
            // recv AR; per beat: read the memory, then send R (blocks while the R queue
            // holds 2: the beat read waits in pr_hold); as far as the queues allow
            // (the loops stop at the first step that cannot move: the idle memory costs
            // a few comparisons per cycle)
            busy = pr_hold || pr_act || arq_n != 2'd0;
            for (it = 0; it < 5 && busy; it = it + 1) begin
                busy = 1'b0;
                if (pr_hold) begin
                    if (rq_n != 2'd2) begin
                        rq_data[rq_n[0]] = pr_data; rq_id[rq_n[0]] = pr_id;
                        rq_resp[rq_n[0]] = pr_bresp; rq_last[rq_n[0]] = pr_last;
                        rq_n = rq_n + 2'd1;
                        pr_hold = 1'b0;
                        if (pr_last) pr_act = 1'b0;
                        busy = 1'b1;
                    end
                end else if (pr_act) begin
                    busy = 1'b1;
                    t_resp = pr_resp;
                    if ((inj_en[0] && (pr_addr >> LB) == (inj_rd_addr >> LB))
                        || (inj_en[1] && rd_beats == inj_rd_beat))
                        t_resp = SLVERR;
                    pr_data = t_resp == OKAY ? mem[word(pr_addr)] : {DATA_W{1'b0}};
                    pr_bresp = t_resp;
                    pr_last = pr_left == 9'd1;
                    pr_hold = 1'b1;
                    rd_beats = rd_beats + 32'd1;
                    pr_addr = pr_addr + (32'd1 << pr_size);
                    pr_left = pr_left - 9'd1;
                end else if (arq_n != 2'd0) begin
                    busy = 1'b1;
                    pr_act = 1'b1;
                    pr_id = arq_id[0]; pr_size = arq_size[0];
                    pr_addr = (arq_addr[0] >> arq_size[0]) << arq_size[0];
                    pr_left = {1'b0, arq_len[0]} + 9'd1;
                    rules = burst_rules(arq_addr[0], arq_len[0], arq_size[0], arq_burst[0]);
                    if (rules[0]) violate(0, arq_addr[0]);
                    if (rules[1]) violate(2, arq_addr[0]);
                    if (rules[2]) violate(4, arq_addr[0]);
                    if (rules[3]) violate(6, arq_addr[0]);
                    pr_resp = rules != 4'd0 ? SLVERR : OKAY;
                    rd_bursts = rd_bursts + 32'd1;
                    arq_id[0] = arq_id[1]; arq_addr[0] = arq_addr[1]; arq_len[0] = arq_len[1];
                    arq_size[0] = arq_size[1]; arq_burst[0] = arq_burst[1];
                    arq_n = arq_n - 2'd1;
                end
            end
            // ================= write process (after the endpoints) =================
            // recv AW; per beat: recv W, write; send B; as far as the queues allow
            busy = pw_bwait || (!pw_act && awq_n != 2'd0) || (pw_act && wq_n != 2'd0);
            for (it = 0; it < 6 && busy; it = it + 1) begin
                busy = 1'b0;
                if (pw_bwait) begin
                    if (bq_n != 2'd2) begin
                        bq_id[bq_n[0]] = pw_id; bq_resp[bq_n[0]] = pw_resp;
                        bq_n = bq_n + 2'd1;
                        pw_bwait = 1'b0;
                        busy = 1'b1;
                    end
                end else if (!pw_act) begin
                    if (awq_n != 2'd0) begin
                        busy = 1'b1;
                        pw_act = 1'b1;
                        pw_id = awq_id[0]; pw_size = awq_size[0];
                        pw_addr = (awq_addr[0] >> awq_size[0]) << awq_size[0];
                        pw_left = {1'b0, awq_len[0]} + 9'd1;
                        rules = burst_rules(awq_addr[0], awq_len[0], awq_size[0], awq_burst[0]);
                        if (rules[0]) violate(1, awq_addr[0]);
                        if (rules[1]) violate(3, awq_addr[0]);
                        if (rules[2]) violate(5, awq_addr[0]);
                        if (rules[3]) violate(7, awq_addr[0]);
                        pw_resp = rules != 4'd0 ? SLVERR : OKAY;
                        pw_drop = inj_en[3] && wr_bursts == inj_wr_burst;
                        wr_bursts = wr_bursts + 32'd1;
                        awq_id[0] = awq_id[1]; awq_addr[0] = awq_addr[1]; awq_len[0] = awq_len[1];
                        awq_size[0] = awq_size[1]; awq_burst[0] = awq_burst[1];
                        awq_n = awq_n - 2'd1;
                    end
                end else if (wq_n != 2'd0) begin
                    busy = 1'b1;
                    // an injected fault fails the write of a beat (as AxiRam's write hook
                    // raising): nothing written, the burst answers SLVERR; a beat without
                    // strobes writes nothing and cannot fail
                    if (wq_strb[0] != {BYTES{1'b0}}) begin
                        if (pw_drop || (inj_en[2] && (pw_addr >> LB) == (inj_wr_addr >> LB))) begin
                            pw_resp = SLVERR;
                        end else begin
                            widx = word(pw_addr);
                            for (i = 0; i < BYTES; i = i + 1)
                                bitmask[8 * i +: 8] = {8{wq_strb[0][i]}};
                            mem[widx] = (mem[widx] & ~bitmask) | (wq_data[0] & bitmask);
                        end
                    end
                    if (wq_last[0] != (pw_left == 9'd1)) violate(8, pw_addr);
                    wr_beats = wr_beats + 32'd1;
                    wq_data[0] = wq_data[1]; wq_strb[0] = wq_strb[1]; wq_last[0] = wq_last[1];
                    wq_n = wq_n - 2'd1;
                    pw_addr = pw_addr + (32'd1 << pw_size);
                    pw_left = pw_left - 9'd1;
                    if (pw_left == 9'd0) begin
                        pw_act = 1'b0;
                        if (bq_n != 2'd2) begin
                            bq_id[bq_n[0]] = pw_id; bq_resp[bq_n[0]] = pw_resp;
                            bq_n = bq_n + 2'd1;
                        end else begin
                            pw_bwait = 1'b1;
                        end
                    end
                end
            end

            prot_err = prot_err | viol;

            // ================= host commands =================
            if (cmd_seq != cmd_done) begin
                cmd_done = cmd_seq;
                case (cmd_op)
                    3'd1: $readmemh("dnnfab_dram_load.hex", mem);
                    3'd2: $writememh("dnnfab_dram_dump.hex", mem, cmd_lo[WORDS_LOG2-1:0], cmd_hi - 1'b1);
                    3'd3: for (k = cmd_lo; k < cmd_hi; k = k + 1'b1)
                              mem[k[WORDS_LOG2-1:0]] = {BYTES{cmd_byte}};
                    3'd4: begin
                        cnt = 32'd0;
                        cmd_first = cmd_hi;
                        for (k = cmd_hi; k > cmd_lo; k = k - 1'b1)
                            if (mem[k[WORDS_LOG2-1:0] - 1'b1] != {BYTES{cmd_byte}}) begin
                                cnt = cnt + 32'd1;
                                cmd_first = k - 1'b1;
                            end
                        cmd_result = cnt;
                    end
                    3'd5: begin prot_err = 16'd0; prot_err_addr = {ADDR_W{1'b0}}; end
                    default: ;
                endcase
            end
        end
    end
endmodule
`default_nettype wire
