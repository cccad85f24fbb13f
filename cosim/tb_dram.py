"""cocotb testbench of the Verilog DRAM ``dnnfab_axi_dram`` on its own (top
``tests/cosim/models/dram_pair.v``): the same master bus drives it and cocotbext-axi's
``AxiRam`` side by side.

* ``equivalence``: random AXI4 traffic (INCR bursts of every size and length up to the
  4 KiB rule, W beats before and after their AW, random strobes, IDs, RREADY/BREADY
  stalls, reads racing writes to the same words, error injection on a read beat, a read
  address, a write burst and a write address): every cycle the two slaves' ready, valid
  and, when valid, payload signals must be equal; at the end both memories are equal.
* ``rules``: each AXI rule the memory checks (4 KiB, burst type, length, size, WLAST,
  valid/payload stability) flags its bit and answers SLVERR.
* ``host_access``: bulk load / read / fill / check round trips at unaligned addresses,
  and the wall time of moving the whole memory through files vs per-word handle writes.

Parameters: ``seed``, ``cycles``, ``report`` (JSON path), ``handles`` (measure handle
access: needs an all-public Verilator build).
"""

import json
import random
import time

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge
import numpy as np

from dnnfab.cosim import params
from dnnfab.cosim.dram import VerilogDram, AxiRamDram, PROTOCOL_RULES

MASTER = ("awid", "awaddr", "awlen", "awsize", "awburst", "awvalid", "wdata", "wstrb", "wlast", "wvalid",
          "bready", "arid", "araddr", "arlen", "arsize", "arburst", "arvalid", "rready")
SLAVE_CTRL = ("awready", "wready", "bvalid", "arready", "rvalid")
SLAVE_PAYLOAD = {"bvalid": ("bid", "bresp"), "rvalid": ("rid", "rdata", "rresp", "rlast")}


def _geometry(dut):
    bus_bytes = len(dut.m_axi__wdata) // 8
    words = 1 << len(dut.dram_mask)
    return bus_bytes, words * bus_bytes


async def _start(dut, axiram):
    for n in MASTER:
        getattr(dut, f"m_axi__{n}").value = 0
    if not axiram:
        for n in SLAVE_CTRL + ("bid", "bresp", "rid", "rdata", "rresp", "rlast"):
            getattr(dut, f"m_axi__{n}").value = 0
    dut.rst.value = 1
    bus_bytes, size = _geometry(dut)
    v = VerilogDram(dut, bus_bytes, size)
    a = AxiRamDram(dut, bus_bytes, size) if axiram else None
    cocotb.start_soon(Clock(dut.clk, 10, unit="ns", impl="gpi").start(start_high=False))
    await ClockCycles(dut.clk, 5)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 5)
    return v, a


def _drive(dut, **sig):
    for k, val in sig.items():
        getattr(dut, f"m_axi__{k}").value = val


def _burst(rng, bus_bytes, span, max_len=16):
    """A random legal INCR burst in ``[0, span)``: (addr, len, size)."""
    lb = bus_bytes.bit_length() - 1
    size = lb if rng.random() < 0.7 else rng.randint(0, lb)
    length = rng.randint(0, max_len - 1) if rng.random() < 0.8 else rng.randint(0, 63)
    nbytes = (length + 1) << size
    addr = rng.randrange(0, span - nbytes) & ~((1 << size) - 1)
    if (addr & 0xFFF) + nbytes > 0x1000:
        addr = (addr & ~0xFFF) + 0x1000 - nbytes
    if rng.random() < 0.1:
        addr |= rng.randrange(0, 1 << size)        # unaligned start (the slave aligns it)
    return addr, length, size


@cocotb.test()
async def equivalence(dut):
    p = params()
    rng = random.Random(p.get("seed", 1))
    v, a = await _start(dut, axiram=True)
    bus_bytes, size = _geometry(dut)
    init = rng.randbytes(size)
    await v.load([(0, init)])
    await a.load([(0, init)])
    n_cycles = p.get("cycles", 3000)
    # a small span: reads race writes to the same words, the injected addresses are hit
    span = p.get("span", 4096)
    # error injection, the same in both models (counted from now)
    rd_addr = rng.randrange(0, span) & ~(bus_bytes - 1)
    wr_addr = rng.randrange(0, span) & ~(bus_bytes - 1)
    inject = p.get("inject", "rd_addr,rd_beat,wr_addr,wr_burst").split(",")
    for m in (v, a):
        m.fail_reads(addr=rd_addr if "rd_addr" in inject else None, beat=37 if "rd_beat" in inject else None)
        m.fail_writes(addr=wr_addr if "wr_addr" in inject else None, burst=5 if "wr_burst" in inject else None)

    plans = []            # write bursts in AW order: [addr, len, size, id, beats]
    aw_i = w_i = 0        # next burst to present on AW / to send W beats of
    w_beat = 0
    ar_cur = aw_cur = w_cur = None
    ars = aws = rbeats = bs = 0
    expect_r = 0          # R beats still to come
    mism = []
    stats = {"r": 0, "b": 0, "r_err": 0, "b_err": 0, "w_before_aw": 0}
    cyc = 0
    stop_at = n_cycles
    lanes = (1 << bus_bytes) - 1

    def sample(prefix):
        out = {}
        for c in SLAVE_CTRL:
            out[c] = str(getattr(dut, f"{prefix}{c}").value)
        for c, pay in SLAVE_PAYLOAD.items():
            if out[c] == "1":
                for n in pay:
                    out[n] = str(getattr(dut, f"{prefix}{n}").value)
        return out

    rready = bready = 0
    while True:
        await RisingEdge(dut.clk)
        cyc += 1
        sa, sv = sample("m_axi__"), sample("v_")
        if sa != sv:
            diff = {k: (sa.get(k), sv.get(k)) for k in set(sa) | set(sv) if sa.get(k) != sv.get(k)}
            mism.append((cyc, diff, v.counters(), a.counters(), rbeats))
            if len(mism) > 5:
                break
        # handshakes of the cycle that just ended (the values before this edge)
        if ar_cur is not None and sa["arready"] == "1":
            ar_cur = None
            ars += 1
        if aw_cur is not None and sa["awready"] == "1":
            aw_cur = None
            aws += 1
        if w_cur is not None and sa["wready"] == "1":
            if aws <= w_i:          # its AW not yet taken
                stats["w_before_aw"] += 1
            w_cur = None
            w_beat += 1
            if w_beat == plans[w_i][1] + 1:
                w_i += 1
                w_beat = 0
        if rready and sa["rvalid"] == "1":
            rbeats += 1
            expect_r -= 1
            stats["r"] += 1
            stats["r_err"] += sa["rresp"] != "00"
        if bready and sa["bvalid"] == "1":
            bs += 1
            stats["b"] += 1
            stats["b_err"] += sa["bresp"] != "00"
        generating = cyc < stop_at
        # next values (driven for the cycle that starts now)
        if ar_cur is None:
            if generating and rng.random() < 0.3:
                addr, length, sz = _burst(rng, bus_bytes, span)
                ar_cur = (rng.randrange(16), addr, length, sz)
                expect_r += length + 1
                _drive(dut, arvalid=1, arid=ar_cur[0], araddr=addr, arlen=length, arsize=sz, arburst=1)
            else:
                _drive(dut, arvalid=0)
        if generating and len(plans) - min(aw_i, w_i) < 4 and rng.random() < 0.3:
            addr, length, sz = _burst(rng, bus_bytes, span)
            plans.append([addr, length, sz, rng.randrange(16)])
        if aw_cur is None:
            # AWs lag behind: W beats of a burst may come before its AW
            hold = aw_i == w_i and w_beat == 0 and rng.random() < 0.6      # let the W beats lead
            if aw_i < len(plans) and not hold and rng.random() < 0.5:
                aw_cur = plans[aw_i]
                aw_i += 1
                _drive(dut, awvalid=1, awid=aw_cur[3], awaddr=aw_cur[0], awlen=aw_cur[1], awsize=aw_cur[2],
                       awburst=1)
            else:
                _drive(dut, awvalid=0)
        if w_cur is None:
            if w_i < len(plans) and rng.random() < 0.75:
                last = w_beat == plans[w_i][1]
                strb = lanes if rng.random() < 0.7 else rng.randrange(0, lanes + 1)
                w_cur = (rng.getrandbits(8 * bus_bytes), strb, int(last))
                _drive(dut, wvalid=1, wdata=w_cur[0], wstrb=strb, wlast=int(last))
            else:
                _drive(dut, wvalid=0)
        rready = int(rng.random() < 0.8)
        bready = int(rng.random() < 0.8)
        _drive(dut, rready=rready, bready=bready)
        if not generating and ar_cur is None and aw_cur is None and w_cur is None and expect_r == 0 \
                and aw_i == len(plans) and w_i == len(plans) and bs == len(plans):
            break
        if cyc > stop_at + 5000:
            raise AssertionError(f"traffic did not drain: {expect_r} R beats, {len(plans) - bs} B missing")
    assert not mism, f"AxiRam and dnnfab_axi_dram differ (cycle, {{signal: (AxiRam, Verilog)}}): {mism[:5]}"
    mem_v = await v.read(0, size)
    mem_a = await a.read(0, size)
    if mem_v != mem_a:
        bad = np.flatnonzero(np.frombuffer(mem_v, np.uint8) != np.frombuffer(mem_a, np.uint8))
        raise AssertionError(f"memories differ at {len(bad)} bytes, first {int(bad[0]):#x}")
    assert v.protocol_error() is None, v.protocol_error()
    stats.update(cycles=cyc, ars=ars, aws=aws, counters=v.counters())
    assert stats["r_err"] and stats["b_err"] and stats["w_before_aw"], json.dumps(stats)
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(stats, f, indent=1)


async def _read_burst(dut, addr, length, size, burst=1, rid=3):
    """Present one AR, collect its R beats (rready 1): [(data, resp, last, id)]."""
    _drive(dut, arvalid=1, arid=rid, araddr=addr, arlen=length, arsize=size, arburst=burst, rready=1)
    while True:
        await RisingEdge(dut.clk)
        if str(dut.v_arready.value) == "1":
            break
    _drive(dut, arvalid=0)
    beats = []
    while len(beats) < length + 1:
        await RisingEdge(dut.clk)
        if str(dut.v_rvalid.value) == "1":
            beats.append((int(dut.v_rdata.value), int(dut.v_rresp.value), int(dut.v_rlast.value),
                          int(dut.v_rid.value)))
    return beats


async def _write_burst(dut, addr, length, size, burst=1, wid=5, lasts=None, data=None):
    bus_bytes = len(dut.m_axi__wdata) // 8
    _drive(dut, awvalid=1, awid=wid, awaddr=addr, awlen=length, awsize=size, awburst=burst, bready=1)
    while True:
        await RisingEdge(dut.clk)
        if str(dut.v_awready.value) == "1":
            break
    _drive(dut, awvalid=0)
    for i in range(length + 1):
        last = (i == length) if lasts is None else lasts[i]
        _drive(dut, wvalid=1, wdata=(data or [i + 1] * (length + 1))[i], wstrb=(1 << bus_bytes) - 1, wlast=int(last))
        while True:
            await RisingEdge(dut.clk)
            if str(dut.v_wready.value) == "1":
                break
    _drive(dut, wvalid=0)
    while True:
        await RisingEdge(dut.clk)
        if str(dut.v_bvalid.value) == "1":
            return int(dut.v_bresp.value), int(dut.v_bid.value)


async def _reset(dut):
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 2)


def _flags(v):
    return int(v.dut.dram_prot_err.value), int(v.dut.dram_prot_err_addr.value)


@cocotb.test()
async def rules(dut):
    """Each AXI rule violation flags its bit (and the first address) and answers SLVERR."""
    v, _ = await _start(dut, axiram=False)
    bus_bytes, size = _geometry(dut)
    lb = bus_bytes.bit_length() - 1
    max_burst = int(params().get("max_burst", 64))
    await v.load([(0, bytes(range(256)) * (size // 256))])
    found = {}

    async def case(bit, coro, expect_slverr=True):
        await _reset(dut)
        assert _flags(v)[0] == 0
        resp = await coro
        flags, addr = _flags(v)
        assert flags == 1 << bit, f"{PROTOCOL_RULES[bit]}: flags {flags:#x}"
        if expect_slverr:
            resps = [b[1] for b in resp] if isinstance(resp, list) else [resp[0]]
            assert all(r == 2 for r in resps), f"{PROTOCOL_RULES[bit]}: responses {resps}"
        msg = v.protocol_error()
        assert PROTOCOL_RULES[bit] in msg, msg
        found[PROTOCOL_RULES[bit]] = addr
        await v.clear_protocol_error()
        assert v.protocol_error() is None

    # legal bursts first: a burst ending exactly at a 4 KiB boundary, one of max_burst beats
    await _reset(dut)
    beats = await _read_burst(dut, 0x1000 - 4 * bus_bytes, 3, lb)
    assert [b[1] for b in beats] == [0] * 4 and [b[2] for b in beats] == [0, 0, 0, 1] and beats[0][3] == 3
    assert (await _write_burst(dut, 0x2000 - 2 * bus_bytes, 1, lb))[0] == 0
    beats = await _read_burst(dut, 0, max_burst - 1, lb)
    assert all(b[1] == 0 for b in beats) and _flags(v)[0] == 0
    await case(0, _read_burst(dut, 0x1000 - 2 * bus_bytes, 2, lb))
    assert found[PROTOCOL_RULES[0]] == 0x1000 - 2 * bus_bytes
    await case(1, _write_burst(dut, 0x3000 - bus_bytes, 1, lb))
    await case(2, _read_burst(dut, 0x100, 1, lb, burst=0))
    await case(3, _write_burst(dut, 0x100, 1, lb, burst=2))
    await case(4, _read_burst(dut, 0, max_burst, lb))
    await case(5, _write_burst(dut, 0, max_burst, lb))
    if lb < 7:
        await case(6, _read_burst(dut, 0, 0, lb + 1))
        await case(7, _write_burst(dut, 0, 0, lb + 1))
    await case(8, _write_burst(dut, 0x200, 2, lb, lasts=[0, 1, 0]), expect_slverr=False)

    # stability: fill the read queue behind a burst the master does not accept (RREADY 0)
    async def ar_dropped():
        _drive(dut, rready=0)
        for i in range(4):          # one being served, two queued, then ARREADY falls
            _drive(dut, arvalid=1, arid=i, araddr=0x40 * i, arlen=15, arsize=lb, arburst=1)
            await RisingEdge(dut.clk)
            while str(dut.v_arready.value) != "1":
                if i == 3:
                    break
                await RisingEdge(dut.clk)
            if i == 3:
                break
        assert str(dut.v_arready.value) == "0"
        _drive(dut, arvalid=0)           # withdrawn before ARREADY
        await ClockCycles(dut.clk, 2)
        return (0, 0)
    await case(9, ar_dropped(), expect_slverr=False)

    async def aw_dropped():
        for i in range(4):          # no W data: the write process waits, AWs queue up
            _drive(dut, awvalid=1, awid=i, awaddr=0x40 * i, awlen=3, awsize=lb, awburst=1)
            await RisingEdge(dut.clk)
            while str(dut.v_awready.value) != "1" and i < 3:
                await RisingEdge(dut.clk)
        assert str(dut.v_awready.value) == "0"
        _drive(dut, awaddr=0x999 & ~(bus_bytes - 1))    # payload changed before AWREADY
        await ClockCycles(dut.clk, 2)
        _drive(dut, awvalid=0)
        return (0, 0)
    await case(10, aw_dropped(), expect_slverr=False)

    async def w_changed():
        for i in range(3):          # no AW: two W beats queue up, WREADY falls
            _drive(dut, wvalid=1, wdata=i, wstrb=(1 << bus_bytes) - 1, wlast=0)
            await RisingEdge(dut.clk)
            while str(dut.v_wready.value) != "1" and i < 2:
                await RisingEdge(dut.clk)
        assert str(dut.v_wready.value) == "0"
        _drive(dut, wdata=12345)
        await ClockCycles(dut.clk, 2)
        _drive(dut, wvalid=0)
        return (0, 0)
    await case(11, w_changed(), expect_slverr=False)
    assert len(found) == (12 if lb < 7 else 10)
    if params().get("report"):
        with open(params()["report"], "w") as f:
            json.dump(found, f, indent=1)


@cocotb.test()
async def host_access(dut):
    """Bulk host access round trips; wall time of whole-memory transfers."""
    p = params()
    rng = random.Random(p.get("seed", 2))
    v, _ = await _start(dut, axiram=False)
    bus_bytes, size = _geometry(dut)
    ref = np.zeros(size, np.uint8)
    await v.fill(0)
    for _ in range(30):
        addr = rng.randrange(0, size - 300)
        n = rng.randrange(1, 300)
        blob = rng.randbytes(n)
        await v.write(addr, blob)
        ref[addr:addr + n] = np.frombuffer(blob, np.uint8)
    images = []
    for _ in range(5):
        addr = rng.randrange(0, size - 5000)
        blob = rng.randbytes(rng.randrange(1, 5000))
        images.append((addr, blob))
    # adjacent unaligned images sharing bus words, and an overlapping one (later wins)
    a0 = rng.randrange(0, size - 20000) | 3
    images += [(a0, rng.randbytes(13)), (a0 + 13, rng.randbytes(29)), (a0 + 20, rng.randbytes(5))]
    await v.load(images)
    for addr, blob in images:
        ref[addr:addr + len(blob)] = np.frombuffer(blob, np.uint8)
    for _ in range(20):
        addr = rng.randrange(0, size - 300)
        n = rng.randrange(0, 300)
        assert await v.read(addr, n) == ref[addr:addr + n].tobytes(), (addr, n)
    assert await v.read(0, size) == ref.tobytes()
    lo, hi = 3 * bus_bytes + 5, size - 2 * bus_bytes - 3
    await v.fill(0x5A, lo, hi)
    ref[lo:hi] = 0x5A
    assert await v.read(0, size) == ref.tobytes()
    assert await v.check_fill(0x5A, lo, hi) is None
    assert await v.check_fill(0x5A, lo - 1, hi) == lo - 1
    assert await v.check_fill(0x5A, lo, hi + 1) == hi
    poke = lo + 1000 * bus_bytes + 3
    await v.write(poke, b"\x00")
    assert await v.check_fill(0x5A, lo, hi) == poke
    assert await v.first_change(0x5A, [(0, lo), (hi, size), (poke, poke + 1)]) is None
    assert await v.first_change(0x5A, [(0, lo), (hi, size)]) == poke

    # whole-memory transfer times (wall clock: a measurement for the note, not asserted)
    figures = {"bytes": size, "words": size // bus_bytes, "bus_bytes": bus_bytes}
    blob = rng.randbytes(size)
    t = time.perf_counter()
    await v.load([(0, blob)])
    figures["file_load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    back = await v.read(0, size)
    figures["file_read_s"] = time.perf_counter() - t
    assert back == blob
    t = time.perf_counter()
    await v.fill(0x11)
    figures["fill_s"] = time.perf_counter() - t
    t = time.perf_counter()
    assert await v.check_fill(0x11, 0, size) is None
    figures["check_s"] = time.perf_counter() - t
    if p.get("handles"):
        mem = dut.v.mem
        words = np.frombuffer(blob, np.uint8).reshape(-1, bus_bytes)
        ints = [int.from_bytes(w.tobytes(), "little") for w in words]
        t = time.perf_counter()
        for i, w in enumerate(ints):
            mem[i].value = w
        await RisingEdge(dut.clk)
        figures["handle_write_s"] = time.perf_counter() - t
        t = time.perf_counter()
        got = [int(mem[i].value) for i in range(len(ints))]
        figures["handle_read_s"] = time.perf_counter() - t
        assert got == ints
        assert await v.read(0, size) == blob
    if p.get("report"):
        with open(p["report"], "w") as f:
            json.dump(figures, f, indent=1)
