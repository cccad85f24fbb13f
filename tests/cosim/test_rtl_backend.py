"""The driver's ``rtl`` backend (cosim/rtl_backend.py): the same host driver as on the model
backend, on the generated Verilog under cocotb -- one simulator process per backend, real
AXI4-Lite register transactions and bulk DRAM syncs; typed faults; the simulator's
lifetime (close, interpreter exit, a host that dies: no orphan process)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from presets import CFG_SMALL
from dnnfab.cosim import runner
from dnnfab.errors import ConfigError, DmaError, FabricTimeout, IllegalInstruction, ToolchainError
from dnnfab.hw.spec import INSN_BYTES, decode
from dnnfab.sw import driver
from dnnfab.sw.compiler.layer import random_layer
from dnnfab.sw.compiler.program import compile_layer

pytestmark = pytest.mark.cosim
SIMS = [pytest.param(s, marks=pytest.mark.skipif(not runner.available(s), reason=f"{s} not installed"))
        for s in runner.SIMULATORS]
needs_verilator = pytest.mark.skipif(not runner.available("verilator"), reason="verilator not installed")


def _layer(seed=1, cin=8, cout=8, hw=(6, 6)):
    rng = np.random.default_rng(seed)
    layer = random_layer(rng, cin, cout, k=3, stride=1, pad=1, in_hw=hw)
    return layer, layer.random_input(rng), compile_layer(layer, CFG_SMALL)


def _load(dev, prog, x):
    for addr, blob in prog.dram_images(x):
        dev.write(addr, blob)
    oa, osz = prog.regions["output"]
    return driver.Program(prog.regions["program"][0], len(prog.insns), oa, oa + osz)


def _alive(pid):
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone_within(pid, seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sim,axil", [*[pytest.param(p.values[0], "verilog", marks=p.marks) for p in SIMS],
                                      pytest.param("verilator", "lean", marks=needs_verilator)])
def test_layers_through_the_driver(sim, axil):
    """Two layers, one simulator: bit-exact, the counters read over AXI4-Lite equal the
    compiler's figures, the registers by name (ID, CONFIG0 checked on open); the Verilog
    AXI4-Lite master and the Python one."""
    with driver.open("rtl", CFG_SMALL, sim=sim, dram_bytes=1 << 20, axil=axil) as dev:
        be = dev.backend
        assert be.name == "rtl" and dev.regs.ID == 0x444E4E46
        for seed in (1, 2):
            layer, x, prog = _layer(seed)
            p = _load(dev, prog, x)
            c = dev.run(p, timeout_s=0.01)
            y = prog.unpack_output(dev.read(p.out_lo, p.out_hi - p.out_lo))
            assert np.array_equal(y, layer.reference(x))
            assert c["macs"] == prog.hw_macs and c["insns"] == len(prog.insns)
            assert c["busy_cycles"] == prog.array_beats and c["cycles"] > c["busy_cycles"]
            assert not dev.regs.STATUS.BUSY and dev.regs.STATUS.DONE
        assert be.launches == 2 and be.sim_cycles() > 2 * c["cycles"]
        pid = be.pid
    assert not _alive(pid), "close() left the simulator running"


@needs_verilator
def test_device_buffers_sync_through_the_simulated_dram():
    with driver.open("rtl", CFG_SMALL, dram_bytes=1 << 20) as dev:
        buf = dev.allocate((1000,), np.uint8)
        other = dev.allocate((333,), np.int8)
        assert other.device_address >= buf.device_address + 1000
        buf[:] = np.arange(1000) % 251
        buf.sync_to_device()
        other[:] = -7
        other[10:20].sync_to_device()           # a view: only its bytes
        assert dev.read(buf.device_address, 1000) == buf.tobytes()
        assert dev.read(other.device_address + 10, 10) == bytes([249]) * 10
        assert dev.read(other.device_address, 10) == bytes(10)
        buf[:] = 0
        buf[3:900].sync_from_device()
        assert buf[3] == 3 and buf[899] == 899 % 251 and buf[0] == 0
        with pytest.raises(Exception, match="device DRAM exhausted"):
            dev.allocate((2 << 20,), np.uint8)


@needs_verilator
def test_faults_are_typed_and_the_device_recovers():
    """SLVERR on a DMA read beat and on a write, an illegal instruction, a program that
    never finishes: each a typed error within the (simulated) timeout, then dev.reset()
    and a clean bit-exact run on the same simulator; then the top's hard reset."""
    layer, x, prog = _layer(3)
    cfg = CFG_SMALL
    with driver.open("rtl", cfg, dram_bytes=1 << 20) as dev:
        be = dev.backend
        insns = prog.insns
        wts = prog.regions["weights"][0]

        def clean():
            p = _load(dev, prog, x)
            dev.run(p, timeout_s=0.01)
            assert np.array_equal(prog.unpack_output(dev.read(p.out_lo, p.out_hi - p.out_lo)),
                                  layer.reference(x))

        p = _load(dev, prog, x)
        be.fail_reads(addr=wts + 3 * cfg.bus_bytes)
        with pytest.raises(DmaError) as e:
            dev.run(p, timeout_s=0.01)
        assert e.value.code == 1 and e.value.address == wts + 3 * cfg.bus_bytes
        be.clear_faults()
        dev.reset()
        clean()

        be.fail_writes(burst=0)
        p = _load(dev, prog, x)
        with pytest.raises(DmaError) as e:
            dev.run(p, timeout_s=0.01)
        assert e.value.code == 2 and e.value.address == p.out_lo
        be.clear_faults()
        dev.reset()
        clean()

        p = _load(dev, prog, x)
        k = len(insns) // 2
        dev.write(p.addr + k * INSN_BYTES, (7).to_bytes(INSN_BYTES, "little"))
        with pytest.raises(IllegalInstruction) as e:
            dev.run(p, timeout_s=0.01)
        assert e.value.index == k
        dev.reset()
        clean()

        # never finishes: the first LOAD also waits for a token no COMPUTE can push
        p = _load(dev, prog, x)
        first = decode(int.from_bytes(prog.program_bytes[:INSN_BYTES], "little"))
        assert type(first).__name__ == "Load"
        first.pop_next = 1
        dev.write(p.addr, first.to_bytes())
        t0 = be.sim_cycles()
        with pytest.raises(FabricTimeout) as e:
            dev.run(p, timeout_s=20e-6)           # 2000 cycles at 100 MHz
        assert be.sim_cycles() - t0 >= 2000
        assert e.value.status & 1 and "controller" in str(e.value)      # BUSY; the hang report
        dev.reset()
        assert not dev.regs.STATUS.BUSY
        clean()
        # the top's reset: the whole accelerator restarts, the DRAM keeps its contents
        be.hard_reset()
        assert dev.regs.ID == 0x444E4E46 and not dev.regs.STATUS.DONE
        clean()


def test_bad_input_is_one_line():
    with pytest.raises(ToolchainError, match="unknown simulator"):
        driver.open("rtl", CFG_SMALL, sim="modelsim")
    with pytest.raises(ConfigError, match="unknown backend"):
        driver.open("fpga", CFG_SMALL)
    with pytest.raises(ConfigError, match="unknown AXI4-Lite master"):
        driver.open("rtl", CFG_SMALL, axil="pcie")


def test_verilator_missing_is_a_toolchain_error(monkeypatch):
    monkeypatch.setattr(runner, "_verilator_root", lambda: None)
    with pytest.raises(ToolchainError, match="Verilator not found"):
        driver.open("rtl", CFG_SMALL)


_HOST = textwrap.dedent(r"""
    import sys, threading, time
    from dnnfab.hw.config import AcceleratorConfig
    from dnnfab.sw import driver
    cfg = AcceleratorConfig.from_dict(__import__("json").loads(sys.argv[1]))
    mode = sys.argv[2]
    def go():
        dev = driver.open("rtl", cfg, dram_bytes=1 << 20)
        print(dev.backend.pid, flush=True)
        if mode == "exit":
            return dev                       # no close(): atexit must end the simulator
        if mode in ("wait", "thread"):
            print("simulating", flush=True)
            dev.backend._call("wait", 10**12)    # a launch that never ends
        time.sleep(600)
    if mode == "thread":                     # no PR_SET_PDEATHSIG off the main thread
        t = threading.Thread(target=go)
        t.start()
        t.join()
    else:
        keep = go()
""")


def _host(mode):
    import json
    return subprocess.Popen([sys.executable, "-c", _HOST, json.dumps(CFG_SMALL.to_dict()), mode],
                            stdout=subprocess.PIPE, text=True, env=dict(os.environ))


@needs_verilator
@pytest.mark.parametrize("mode", ["exit", "idle", "wait", "thread"])
def test_no_orphan_simulator(mode):
    """The simulator ends when the host exits without close() (atexit), and when the host
    is killed while the simulator waits for a request or simulates (PR_SET_PDEATHSIG; off
    the main thread, the socket's end-of-file checked between chunks of cycles)."""
    host = _host(mode)
    try:
        pid = int(host.stdout.readline())
        assert _alive(pid)
        if mode == "exit":
            assert host.wait(60) == 0
        else:
            if mode in ("wait", "thread"):
                assert host.stdout.readline().strip() == "simulating"
                time.sleep(1.0)
                assert _alive(pid)
            host.send_signal(signal.SIGKILL)
            host.wait(10)
        assert _gone_within(pid, 60), f"simulator {pid} outlived its host ({mode})"
    finally:
        if host.poll() is None:
            host.kill()
