"""The fabric's timing and token model, what the compiler needs to know a program runs.

Timing comes from an event model of the three decoupled engines and their dependency
tokens (:func:`estimate_cycles`), whose constants are the hardware's pipeline latencies
(:mod:`dnnfab.hw.spec`, plus the calibrated ones below); tests compare it against
RTL-measured cycles per layer. The bit-exact executor of the same programs, the driver's
model backend, is :class:`dnnfab.sw.driver.fastmodel.FastModel`.

Before anything runs, :func:`check_tokens` plays the program through a model of the
controller's dispatcher, queues and token counters (:class:`TokenMachine`), with the RTL's
queue capacity and counter width: a program that would hang the accelerator raises
:class:`~dnnfab.errors.FabricDeadlock` here instead of passing silently, and the data and
timing models then follow an order the hardware could take.
"""

from collections import deque

import numpy as np
from dataclasses import dataclass, field

from ...errors import FabricError, FabricDeadlock
from ...hw.spec import (Load, Store, Compute, INSN_BYTES, array_latency, min_tile_rows, RQ_LATENCY, QUEUE_DEPTH, FETCH_CHUNK,
                        START_LATENCY, FETCH_LATENCY, TOKEN_BITS)

__all__ = ["estimate_cycles", "CycleReport", "check_tokens", "TokenReport",
           "TokenMachine", "QUEUE_CAPACITY", "TOKEN_BITS", "TOKEN_MAX", "ENGINES", "CHANNELS"]


def _wrap32(x):
    """Two's-complement wrap to int32 (the accumulator's width), as int64."""
    if isinstance(x, np.ndarray):
        return x.astype(np.int32).astype(np.int64)      # truncation is the wrap
    return ((x + (1 << 31)) % (1 << 32)) - (1 << 31)


# ------------------------------------------------------------------ token machine
#: Instructions an engine holds before its head must have its tokens: the controller's
#: per-engine ``RegFIFO(INSN_BITS, QUEUE_DEPTH)`` (hw/controller.py; ``w_rdy`` is low once
#: QUEUE_DEPTH entries are stored or being stored, hw/dma.py) plus the engine's head
#: register (``*_h_valid``/``*_h``, filled from the queue whenever empty): 8 + 1 = 9. The
#: token gate sits between the head register and the command register (``rd_cmd``,
#: ``wr_cmd``, ``cinsn``), so an instruction past it has taken its tokens and completes
#: without needing any more; one for the same engine behind those 9 waits in the
#: dispatcher's instruction register and blocks dispatch of everything after it.
QUEUE_CAPACITY = QUEUE_DEPTH + 1
# TOKEN_BITS: ``_TokenCounter.count`` (hw/controller.py), from hw/spec.py
TOKEN_MAX = (1 << TOKEN_BITS) - 1

ENGINES = ("LOAD", "COMPUTE", "STORE")
CHANNELS = ("l2c", "c2l", "c2s", "s2c")
_LOAD, _COMPUTE, _STORE = range(3)
# the flags the RTL reads per engine (others are ignored by the hardware, and here):
# LOAD pops c2l (pop_next), pushes l2c (push_next) when the DMA reports it complete;
# COMPUTE pops l2c (pop_prev) and s2c (pop_next), pushes c2l (push_prev) once its inputs
# are read and c2s (push_next) once its outputs are written; STORE pops c2s (pop_prev),
# pushes s2c (push_prev) on completion.
_POPS = {_LOAD: (("pop_next", "c2l"),), _COMPUTE: (("pop_prev", "l2c"), ("pop_next", "s2c")),
         _STORE: (("pop_prev", "c2s"),)}
_PUSHES = {_LOAD: (("push_next", "l2c"),), _COMPUTE: (("push_prev", "c2l"), ("push_next", "c2s")),
           _STORE: (("push_prev", "s2c"),)}
_CONSUMER = {"l2c": _COMPUTE, "s2c": _COMPUTE, "c2l": _LOAD, "c2s": _STORE}


def _engine(insn):
    if isinstance(insn, Load):
        return _LOAD
    if isinstance(insn, Compute):
        return _COMPUTE
    if isinstance(insn, Store):
        return _STORE
    raise FabricError(f"illegal instruction {insn!r} (error 3)")


@dataclass
class TokenReport:
    """What :func:`check_tokens` found for a program that runs to completion."""
    order: list                 # program indices in an order the engines could take them
    peak: dict                  # channel -> highest count any timing can reach
    peak_fill: dict             # engine -> most instructions queued (FIFO + head register)
    dispatched: int = 0         # instructions dispatched (all, unless halted)
    halted: bool = False        # the dispatcher reached the end with ``halt_at_end``


@dataclass
class TokenMachine:
    """The controller's dispatch / queue / token protocol, one instruction at a time.

    Dispatch is in program order into per-engine queues of ``capacity`` instructions (the
    dispatcher waits while the target queue is full); each engine takes its head only when
    every token it pops has a count > 0, and an instruction's pushes happen when it
    completes (here: right after it is taken; it needs nothing else to complete). Counts
    are ``TOKEN_BITS`` wide: a push beyond ``TOKEN_MAX`` would wrap in the RTL and raises.

    The protocol is *persistent* (each counter has one consumer engine, only the
    dispatcher fills queues), so whether a program finishes, and the state it deadlocks in,
    does not depend on timing; the largest count a counter reaches does. ``last`` names an
    engine that takes a step only when nothing else can move: that schedule reaches the
    largest counts of the counters it pops (every other engine runs as far ahead as it can
    before each of its takes).
    """
    insns: list
    capacity: int = QUEUE_CAPACITY
    last: int = None
    halt_at_end: bool = False
    counts: dict = field(default_factory=lambda: dict.fromkeys(CHANNELS, 0))

    def run(self) -> TokenReport:
        n = len(self.insns)
        eng, pops, pushes = [], [], []
        for ins in self.insns:
            e = _engine(ins)
            eng.append(e)
            pops.append(tuple(ch for f, ch in _POPS[e] if getattr(ins, f)))
            pushes.append(tuple(ch for f, ch in _PUSHES[e] if getattr(ins, f)))
        counts = self.counts
        peak = dict(counts)
        queues = [deque(), deque(), deque()]
        fill = [0, 0, 0]
        order = []
        d = 0
        cap = self.capacity
        others = [e for e in range(3) if e != self.last]

        def ready(i):
            for ch in pops[i]:
                if counts[ch] == 0:
                    return False
            return True

        def take(e):
            i = queues[e].popleft()
            for ch in pops[i]:
                counts[ch] -= 1
            for ch in pushes[i]:
                c = counts[ch] + 1
                if c > TOKEN_MAX:
                    raise FabricError(
                        f"token overflow: {ENGINES[e]} insn {i} pushes {ch} past {TOKEN_MAX} "
                        f"(the {TOKEN_BITS}-bit counter would wrap to 0 and its consumer "
                        f"{ENGINES[_CONSUMER[ch]]} would hang or run early); "
                        f"{self._state(queues, d, n)}; pop the tokens sooner or push fewer")
                counts[ch] = c
                if c > peak[ch]:
                    peak[ch] = c
            order.append(i)

        while True:
            moved = False
            while d < n and len(queues[eng[d]]) < cap:
                q = queues[eng[d]]
                q.append(d)
                if len(q) > fill[eng[d]]:
                    fill[eng[d]] = len(q)
                d += 1
                moved = True
            if d == n and self.halt_at_end:
                break
            for e in others:
                q = queues[e]
                while q and ready(q[0]):
                    take(e)
                    moved = True
            if moved:
                continue
            if self.last is not None and queues[self.last] and ready(queues[self.last][0]):
                take(self.last)
                continue
            break

        report = TokenReport(order=order, peak=peak,
                             peak_fill={ENGINES[e]: fill[e] for e in range(3)},
                             dispatched=d, halted=self.halt_at_end and d == n)
        if report.halted:
            return report
        if len(order) < n:
            blocked = {}
            for e in range(3):
                if queues[e]:
                    i = queues[e][0]
                    blocked[ENGINES[e]] = (i, tuple(ch for ch in pops[i] if counts[ch] == 0))
            raise FabricDeadlock(
                f"deadlock: {len(order)} of {n} instructions retired, then no engine can move: "
                f"{self._state(queues, d, n, blocked)}; check the token flags: each pop needs a "
                f"matching push that dispatch reaches with at most {cap} instructions waiting "
                f"per engine",
                blocked=blocked, tokens=dict(counts),
                fills={ENGINES[e]: len(queues[e]) for e in range(3)}, retired=len(order))
        left = {ch: c for ch, c in counts.items() if c}
        if left:
            raise FabricError(
                "tokens left over at the end: " + ", ".join(f"{ch}={c}" for ch, c in left.items())
                + " (the counters are not cleared by START, only by reset or SOFT_RESET, so the "
                "next program would start with them and could run before its producers); "
                "every push needs a matching pop")
        return report

    def _state(self, queues, d, n, blocked=None):
        parts = []
        if blocked is not None:
            for e in range(3):
                name = ENGINES[e]
                if name in blocked:
                    i, chs = blocked[name]
                    parts.append(f"{name} insn {i} waits for {'+'.join(chs)}")
                else:
                    parts.append(f"{name} idle")
        if d < n:
            e = _engine(self.insns[d])
            why = " queue full" if len(queues[e]) >= self.capacity else ""
            parts.append(f"dispatch at insn {d} ({ENGINES[e]}{why})")
        parts.append("tokens " + " ".join(f"{ch}={self.counts[ch]}" for ch in CHANNELS))
        parts.append("queues " + " ".join(f"{ENGINES[e]} {len(queues[e])}/{self.capacity}"
                                          for e in range(3)))
        return ", ".join(parts)


def check_tokens(insns, capacity=QUEUE_CAPACITY, halt_at_end=False, key=None) -> TokenReport:
    """Play ``insns`` through the controller's queues and token counters (:class:`TokenMachine`).

    Raises :class:`~dnnfab.errors.FabricDeadlock` if the program can never finish (the
    hardware would hang), :class:`~dnnfab.errors.FabricError` if a counter could exceed
    ``TOKEN_MAX`` under some timing or tokens are left over at the end. Returns the take
    order of the schedule where COMPUTE moves last (loads and stores as far ahead as the
    tokens let them) and each counter's peak over all timings. O(instructions).
    """
    insns = list(insns)
    # a pure function of the instruction words: the model backend's prepare and its cycle
    # estimate both ask it of the same program (three token-machine passes each); a
    # caller that has the program's bytes passes them as ``key`` and the answer is kept
    if key is not None:
        key = (capacity, halt_at_end, bytes(key))
    hit = _TOKEN_MEMO.get(key) if key is not None else None
    if hit is not None:
        return TokenReport(list(hit.order), dict(hit.peak), dict(hit.peak_fill),
                           hit.dispatched, hit.halted)
    rep = _check_tokens(insns, capacity, halt_at_end)
    if key is not None:
        if len(_TOKEN_MEMO) >= 256:
            _TOKEN_MEMO.pop(next(iter(_TOKEN_MEMO)))
        _TOKEN_MEMO[key] = TokenReport(list(rep.order), dict(rep.peak), dict(rep.peak_fill),
                                       rep.dispatched, rep.halted)
    return rep


_TOKEN_MEMO = {}


def _check_tokens(insns, capacity, halt_at_end):
    peak = dict.fromkeys(CHANNELS, 0)
    fills = dict.fromkeys(ENGINES, 0)
    main = None
    for last in (_COMPUTE, _LOAD, _STORE):
        rep = TokenMachine(insns, capacity=capacity, last=last, halt_at_end=halt_at_end).run()
        if main is None:
            main = rep
        for ch in CHANNELS:
            peak[ch] = max(peak[ch], rep.peak[ch])
        for e in ENGINES:
            fills[e] = max(fills[e], rep.peak_fill[e])
        if halt_at_end:
            break           # the dispatcher reached the end: the run stops there
    main.peak, main.peak_fill = peak, fills
    return main


@dataclass
class CycleReport:
    cycles: int
    array_beats: int
    compute_cycles: int        # cycles the array stream is busy (incl. weight-preload stalls)
    load_cycles: int
    store_cycles: int
    insn_end: list = field(default_factory=list, repr=False)   # per instruction (program order)

    def utilization(self, cfg, macs):
        return macs / (self.cycles * cfg.rows * cfg.cols)


# Pipeline constants of the RTL (cycles); calibrated against RTL measurements in the
# tests (tests/cosim/test_accel_layers.py asserts the estimate within a tolerance).
# START_LATENCY (CTRL write -> first fetch request) and FETCH_LATENCY (read command ->
# instructions in the queue) come from hw/spec.py.
# Read-channel effects measured on the RTL (tests/cosim/test_fuzz_rtl.py, scripts/fuzz_rtl.py
# records; per-cycle traces of the controller's selections): only the second instruction
# chunk, requested right behind the first, delays the loads (later chunks slip into gaps);
# with a 64-bit bus (4 beats per instruction) consecutive LOADs complete about
# ``NARROW_LOAD_GAP`` cycles further apart than their beats alone (measured, not yet
# explained by the RTL's documented behaviour; 128-bit buses show no gap).
FETCH_BLOCKING_CHUNKS = 1
FETCH_SPACING = 5          # a fetch command at most every 5th cycle (hw/controller.py: fetch_go_ddd)
NARROW_LOAD_GAP = 6
DMA_READ_LATENCY = 7       # AR -> first beat in a scratchpad (AXI RAM model)
DMA_WRITE_LATENCY = 10     # last W beat -> B response (incl. the scratchpad read)
DECODE_LATENCY = 11        # COMPUTE dequeued -> job in the feeders (incl. the cinsn and job-head registers)
FEED_LATENCY = 9           # feeder read -> array input (incl. the FIFO head register)
BACKEND_LATENCY = 6 + RQ_LATENCY   # (incl. the back end's input register)


def estimate_cycles(prog) -> CycleReport:
    """Analytical cycle count of a program: an event model of the three engines.

    Loads run back to back on the read channel (one beat per cycle), stores on the write
    channel, computes stream their K tiles through the array at one pixel per cycle (or
    the weight-preload rate for tiles shorter than ``2R + C + 1``); tokens delay each
    engine until its producer finished.
    """
    cfg = prog.cfg
    R, C = cfg.rows, cfg.cols
    bus = cfg.bus_bytes
    lat = array_latency(R, C)
    mtr = min_tile_rows(R, C)
    # Instruction fetch shares the read channel with the loads (fetches go first): chunk
    # 0 is the start latency; chunk c >= 1 is requested once the beat FIFO (two chunks
    # deep) has room for it, i.e. once all but 16 of the instructions up to it have been
    # taken by the dispatcher (at most every ``FETCH_SPACING``-th cycle). The dispatcher
    # takes one instruction per ``bpi + 1`` cycles (the gearbox assembles bpi beats, then
    # the take), once its chunk has arrived. (Measured on the RTL with a per-cycle trace of the
    # controller's selections; queue-full stalls of the dispatcher are not modelled.)
    insns = prog.insns
    bpi = max(1, INSN_BYTES // bus)
    gear = bpi + 1
    load_gap = NARROW_LOAD_GAP if bpi >= 4 else 0
    n_insns = len(insns)
    n_chunks = -(-n_insns // FETCH_CHUNK)
    chunk_at = [START_LATENCY]                  # read-channel slot of each chunk's command
    fetch_lat = FETCH_LATENCY + bpi - 2          # (the first instruction's beats)
    chan = START_LATENCY + fetch_lat            # read channel free (chunk 0 done)
    pending = []                                # chunks requested, not yet on the channel
    avail_t = []                                # issue time of each instruction (dispatch + 3)

    def avail(i):
        while len(avail_t) <= i:
            j = len(avail_t)
            ensure_chunk(j // FETCH_CHUNK)
            t = chunk_at[j // FETCH_CHUNK] + fetch_lat
            avail_t.append(max(t, avail_t[-1] + gear) if avail_t else t)
        return avail_t[i]

    def request(c):
        if c < n_chunks:
            k = min(n_insns, (c + 1) * FETCH_CHUNK) - 2 * FETCH_CHUNK - 1    # taken before room
            t = START_LATENCY + FETCH_SPACING if k < 0 else avail(k) - 3 + 1
            pending.append((max(t, START_LATENCY + FETCH_SPACING * c), c))

    def place_fetches(until):
        """Put the fetches requested by ``until`` on the channel (they go first)."""
        nonlocal chan
        while pending and pending[0][0] <= until:
            t_req, c = pending.pop(0)
            at = max(t_req, chan)
            chunk_at.append(at)
            if c <= FETCH_BLOCKING_CHUNKS:
                chan = at + min(FETCH_CHUNK, n_insns - c * FETCH_CHUNK) * bpi
            request(c + 1)

    def ensure_chunk(c):
        while len(chunk_at) <= c:
            place_fetches(pending[0][0])

    request(1)
    t_load = chan
    t_comp_free = 0          # the array can accept the next instruction's first beat
    t_store = 0
    done = []                # completion time of each instruction (program order)
    read_done = {}           # compute idx -> inputs released
    l2c = []; c2l = []; c2s = []; s2c = []       # token push times, in order
    pops = {"l2c": 0, "c2l": 0, "c2s": 0, "s2c": 0}
    load_cycles = store_cycles = compute_cycles = 0
    beats_total = 0
    first_compute = True
    insn_end = [0] * len(insns)
    for i in check_tokens(insns, key=getattr(prog, "raw", None)).order:
        ins = insns[i]
        ensure_chunk(i // FETCH_CHUNK)
        if isinstance(ins, Load):
            start = max(t_load, avail(i))
            if ins.pop_next:
                start = max(start, c2l[pops["c2l"]]); pops["c2l"] += 1
            place_fetches(start)
            start = max(start, chan)
            beats = ins.beats
            chan = start + beats + load_gap
            end = start + DMA_READ_LATENCY + beats
            t_load = start + beats + load_gap   # the next request pipelines behind this one
            load_cycles += beats
            if ins.push_next:
                l2c.append(end)
            done.append(end)
            insn_end[i] = end
        elif isinstance(ins, Compute):
            start = t_comp_free
            if ins.pop_prev:
                start = max(start, l2c[pops["l2c"]] + DECODE_LATENCY); pops["l2c"] += 1
            if ins.pop_next:
                start = max(start, s2c[pops["s2c"]] + DECODE_LATENCY); pops["s2c"] += 1
            P, KT = ins.pixels, ins.k_tiles
            if first_compute:
                start += R + FEED_LATENCY       # the first weight tile preloads unhidden
                first_compute = False
            slot = max(P, mtr)
            stream = KT * slot - (slot - P)
            end_stream = start + stream
            compute_cycles += stream
            beats_total += KT * P
            # the next instruction's first tile waits for its weight preload like any
            # other tile: tiles start at least ``min_tile_rows`` apart
            t_comp_free = start + KT * slot
            if ins.push_prev:
                c2l.append(end_stream)
            end = end_stream + lat + BACKEND_LATENCY
            if ins.push_next:
                c2s.append(end)
            done.append(end)
            insn_end[i] = end
        else:
            start = t_store
            if ins.pop_prev:
                start = max(start, c2s[pops["c2s"]]); pops["c2s"] += 1
            beats = ins.beats
            end = start + 2 + beats + DMA_WRITE_LATENCY
            t_store = start + beats
            store_cycles += beats
            if ins.push_prev:
                s2c.append(end)
            done.append(end)
            insn_end[i] = end
    total = max(done) + 2 if done else 0
    return CycleReport(cycles=total, array_beats=beats_total, compute_cycles=compute_cycles,
                       load_cycles=load_cycles, store_cycles=store_cycles, insn_end=insn_end)
