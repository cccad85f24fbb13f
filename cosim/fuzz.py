"""Random layers for RTL fuzzing: a layer is a one-line JSON spec, rebuilt bit for bit.

A spec is a plain dict (``cin``, ``cout``, ``k``, ``stride``, ``pad``, ``hw``,
``dilation``, ``seed`` and optionally ``values``, ``zx``, ``zy``, ``relu``, ``rq``,
``name``); :func:`layer_from_spec` turns it into the same :class:`ConvLayer` and input on
every machine (numpy's PCG64 streams are stable), so a failing case printed as one JSON
line is its own repro. :func:`draw_spec` draws specs that reach the compiler's and the
controller's corners on a given configuration:

* ``banded``: more output pixels than the accumulator / activation / output scratchpads
  hold, so the layer runs in several row bands (ping-pong halves);
* ``kchunk``: a weight block (one M tile) larger than half the weight scratchpad, so K is
  split over several COMPUTEs (partial sums kept in the accumulator);
* ``mtiles``: many output-channel tiles, channel counts that are not multiples of R / C;
* ``k7``: 7x7 stride-2 stems; ``gemm``: a 1 x N image; ``pixel``: a 1x1 output;
  ``row``: a one-row output; ``column``: a one-pixel-wide image; ``conv``: the rest
  (strides 1-3, asymmetric padding, dilation 1-3).

``values`` is ``"random"`` (uniform int8 with a sprinkling of -128/127), ``"extreme"``
(inputs only -128/127, weights only -128/127) or ``"zero"`` (inputs equal to the zero
point: every output is the bias path); ``zx``/``zy`` pin the zero points (e.g. -128,
127); ``rq`` = ``"extreme"`` gives some channels the largest gain (m = 2^15-1, n = 1) and
some the smallest (n = 63).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ..hw.config import AcceleratorConfig
from ..sw.compiler.layer import ConvLayer, random_layer

__all__ = ["layer_from_spec", "draw_spec", "draw_cases", "check_model", "run_rtl", "evaluate", "fuzz", "KINDS"]

KINDS = ("conv", "banded", "kchunk", "mtiles", "k7", "gemm", "pixel", "row", "column")


def _pair(v):
    return tuple(v) if isinstance(v, (list, tuple)) else (int(v), int(v))


def layer_from_spec(spec: dict):
    """``(ConvLayer, int8 input [h, w, cin])`` of a spec (deterministic)."""
    rng = np.random.default_rng(spec["seed"])
    pad = spec.get("pad", 0)
    pad = tuple(pad) if isinstance(pad, (list, tuple)) else int(pad)
    layer = random_layer(rng, spec["cin"], spec["cout"], k=_pair(spec["k"]), stride=_pair(spec.get("stride", 1)),
                         pad=pad, in_hw=tuple(spec["hw"]), dilation=_pair(spec.get("dilation", 1)),
                         relu=spec.get("relu"), name=spec.get("name", "conv"))
    x = layer.random_input(rng)
    values = spec.get("values", "random")
    if values == "extreme" or "zx" in spec or "zy" in spec or spec.get("rq") == "extreme":
        w = layer.weight.astype(np.int64)
        bias = layer.bias.astype(np.int64) + layer.zx * w.reshape(layer.cout, -1).sum(1)   # unfold zx
        zx = int(spec.get("zx", layer.zx))
        zy = int(spec.get("zy", layer.zy))
        m, n = layer.m.copy(), layer.n.copy()
        if values == "extreme":
            w = np.where(rng.integers(0, 2, size=w.shape) == 1, 127, -128)
            x = np.where(rng.integers(0, 2, size=x.shape) == 1, 127, -128).astype(np.int8)
            # keep the outputs spread: the accumulators grow ~ 128 * 128 * sqrt(K)
            n = np.clip(n + 1, 1, 63)
        if spec.get("rq") == "extreme":
            sel = rng.integers(0, 3, size=layer.cout)
            m = np.where(sel == 1, (1 << 15) - 1, np.where(sel == 2, 1 << 14, m))
            n = np.where(sel == 1, 1, np.where(sel == 2, 63, n))
        lo = max(-128, zy) if layer.lo != -128 else -128
        layer = ConvLayer(weight=w.astype(np.int8), bias=bias - zx * w.reshape(layer.cout, -1).sum(1), m=m, n=n,
                          zx=zx, zy=zy, lo=lo, hi=127, stride=layer.stride, pad=layer.pad,
                          dilation=layer.dilation, in_hw=layer.in_hw, name=layer.name)
    if values == "zero":
        x = np.full_like(x, layer.zx)
    return layer, x


def _capacity_px(cfg: AcceleratorConfig, cout):
    """Output pixels one band can hold (the smaller of the accumulator's and the output
    scratchpad's half), a rough guide for drawing multi-band layers."""
    out_cp = -(-cout // max(cfg.rows, cfg.cols, cfg.bus_bytes)) * max(cfg.rows, cfg.cols, cfg.bus_bytes)
    acc_px = cfg.acc_kib * 1024 // (4 * cfg.cols)
    out_px = cfg.out_kib * 1024 // 2 // out_cp
    return max(1, min(acc_px, out_px))


def draw_spec(rng: np.random.Generator, cfg: AcceleratorConfig, kind: str | None = None) -> dict:
    """One random spec of ``kind`` (random kind if None) for ``cfg``."""
    R, C = cfg.rows, cfg.cols
    kind = kind or str(rng.choice(KINDS))
    ri = lambda lo, hi: int(rng.integers(lo, hi + 1))     # noqa: E731 - inclusive range
    spec = dict(k=3, stride=1, pad=0, dilation=1)
    if kind == "conv":
        k = int(rng.choice([1, 2, 3, 5]))
        s = ri(1, 3)
        d = int(rng.choice([1, 1, 1, 2, 3])) if k > 1 else 1
        pads = [ri(0, k // 2 + (d - 1)) for _ in range(4)] if rng.random() < 0.5 else ri(0, k // 2)
        span = d * (k - 1) + 1
        spec.update(cin=ri(1, 4 * R + 3), cout=ri(1, 3 * C + 5), k=k, stride=s, pad=pads, dilation=d,
                    hw=[ri(span, span + 14), ri(span, span + 14)])
    elif kind == "banded":
        k = int(rng.choice([1, 3]))
        cout = ri(1, 2 * C)
        px = int(_capacity_px(cfg, cout) * rng.uniform(1.2, 2.6))
        w = ri(8, 64)
        h = max(2, px // w + 1)
        spec.update(cin=ri(1, 2 * R + 1), cout=cout, k=k, pad=k // 2, hw=[h, w])
    elif kind == "kchunk":
        k = int(rng.choice([1, 3]))
        half_blocks = cfg.wgt_kib * 1024 // 2 // (R * C)       # R-blocks of one kxk position
        cb = int(half_blocks / (k * k) * rng.uniform(1.1, 2.2)) + 1
        spec.update(cin=cb * R - ri(0, R - 1), cout=ri(1, C + 3), k=k, pad=int(rng.integers(0, 2)) * (k // 2),
                    hw=[ri(1, 3) + k - 1, ri(1, 3) + k - 1])
    elif kind == "mtiles":
        spec.update(cin=ri(1, 2 * R + 3), cout=ri(4 * C + 1, 9 * C + 7), k=int(rng.choice([1, 3])), pad=1,
                    hw=[ri(2, 7), ri(2, 7)])
    elif kind == "k7":
        spec.update(cin=ri(1, 2 * R), cout=ri(1, 2 * C + 3), k=7, stride=2, pad=3, hw=[ri(7, 24), ri(7, 24)])
    elif kind == "gemm":
        spec.update(cin=ri(1, 40 * R), cout=ri(1, 6 * C + 1), k=1, hw=[1, ri(1, 40)])
    elif kind == "pixel":
        k = int(rng.choice([1, 3, 5]))
        if rng.random() < 0.5:
            spec.update(hw=[k, k], pad=0)                     # the kernel covers the image
        else:
            spec.update(hw=[1, 1], pad=k // 2)                # mostly padding
        spec.update(cin=ri(1, 6 * R), cout=ri(1, 3 * C), k=k)
    elif kind == "row":
        k = int(rng.choice([1, 3]))
        spec.update(cin=ri(1, 3 * R), cout=ri(1, 3 * C), k=k, stride=ri(1, 2), hw=[k, ri(k, 60)])
    elif kind == "column":
        spec.update(cin=ri(1, 3 * R), cout=ri(1, 2 * C), k=3, pad=1, hw=[ri(1, 40), 1])
    else:
        raise ValueError(f"unknown fuzz kind {kind!r}; use one of {', '.join(KINDS)}")
    r = rng.random()
    if r < 0.15:
        spec["values"] = "extreme"
    elif r < 0.2:
        spec["values"] = "zero"
    if rng.random() < 0.2:
        spec["zx"] = int(rng.choice([-128, 127]))
    if rng.random() < 0.2:
        spec["zy"] = int(rng.choice([-128, 127]))
    if rng.random() < 0.2:
        spec["rq"] = "extreme"
    spec["relu"] = bool(rng.integers(0, 2))
    spec["seed"] = int(rng.integers(0, 2 ** 31))
    spec["name"] = kind
    return spec


def spec_macs(spec):
    layer, _ = layer_from_spec(spec)
    return layer.macs


def out_size(spec):
    """Output (oh, ow) of a spec without building its weights."""
    kh, kw = _pair(spec["k"])
    sh, sw = _pair(spec.get("stride", 1))
    dh, dw = _pair(spec.get("dilation", 1))
    p = spec.get("pad", 0)
    pt, pl, pb, pr = (p, p, p, p) if isinstance(p, int) else tuple(p)
    h, w = spec["hw"]
    return ((h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (w + pl + pr - dw * (kw - 1) - 1) // sw + 1)


def is_valid(spec):
    oh, ow = out_size(spec)
    return oh >= 1 and ow >= 1 and math.prod(spec["hw"]) >= 1


def draw_cases(cfg, count, seed, max_cycles=60000):
    """``count`` specs (every kind in turn) whose model estimate is at most
    ``max_cycles``, each as ``(spec, estimated cycles)`` with its watchdog ``limit`` set
    (``2 x estimate + 10000``); specs the compiler rejects are redrawn (counted)."""
    from ..sw.compiler.program import compile_layer, UnsupportedLayerError
    from ..sw.compiler.fastmodel import estimate_cycles
    rng = np.random.default_rng(seed)
    cases, rejected = [], 0
    while len(cases) < count:
        kind = KINDS[len(cases) % len(KINDS)]
        spec = draw_spec(rng, cfg, kind)
        if not is_valid(spec):
            rejected += 1
            continue
        try:
            prog = compile_layer(layer_from_spec(spec)[0], cfg)
            while kind == "banded" and len(prog.bands) < 2 and spec["hw"][0] < 4095:
                # grow the image until it needs several row bands on this configuration
                spec["hw"][0] = min(4095, spec["hw"][0] * 2)
                prog = compile_layer(layer_from_spec(spec)[0], cfg)
        except UnsupportedLayerError:
            rejected += 1
            continue
        est = estimate_cycles(prog).cycles
        if est > max_cycles:
            rejected += 1
            continue
        cases.append((with_limit(spec, est), est))
    return cases, rejected


def with_limit(spec, est):
    """``spec`` with the RTL watchdog set from the model's estimate."""
    return {**spec, "limit": 2 * int(est) + 10000}


def estimate(cfg, spec):
    from ..sw.compiler.program import compile_layer
    from ..sw.compiler.fastmodel import estimate_cycles
    return estimate_cycles(compile_layer(layer_from_spec(spec)[0], cfg)).cycles


def check_model(cfg, spec):
    """The fast model on the case: ``None`` if bit-exact with the reference, else the
    reason (a deadlock raises :class:`~dnnfab.errors.FabricError` naming the engines)."""
    from ..sw.compiler.program import compile_layer
    from ..sw.driver.fastmodel import FastModel
    layer, x = layer_from_spec(spec)
    y = FastModel(cfg).run_layer(compile_layer(layer, cfg), x)
    if not np.array_equal(y, layer.reference(x)):
        return f"fast model: {int((y != layer.reference(x)).sum())} outputs differ from the reference"
    return None


def run_rtl(cfg, specs, sim, on_record, dram=None):
    """Run ``specs`` on the RTL in one simulator launch (another after a crash), calling
    ``on_record`` with each layer's record as it finishes (a crash record for a layer
    that killed the simulator). ``dram``: the testbench's DRAM model (default
    :data:`dnnfab.cosim.dram.DEFAULT_DRAM`)."""
    import threading
    from .dram import DEFAULT_DRAM, run_accel
    from ..errors import DnnfabError
    dram = dram or DEFAULT_DRAM
    todo = list(specs)
    while todo:
        with tempfile.TemporaryDirectory() as tmp:
            prog_file = Path(tmp) / "progress.jsonl"
            prog_file.touch()
            err = []

            def launch():
                try:
                    run_accel(cfg, "layers", {"layers": todo, "keep_going": True, "progress": str(prog_file)},
                              sim=sim, dram=dram, waves_on_failure=False)
                except DnnfabError as exc:
                    err.append(str(exc))
            th = threading.Thread(target=launch, daemon=True)
            th.start()
            seen = 0
            while True:
                alive = th.is_alive()
                text = prog_file.read_text()
                complete = text[:text.rfind("\n") + 1].splitlines()     # whole lines only
                for line in complete[seen:]:
                    on_record(json.loads(line))
                seen = max(seen, len(complete))
                if not alive:
                    break
                th.join(0.5)
        todo = todo[seen:]
        if todo:
            why = err[0].splitlines()[0][:500] if err else "the simulator stopped without a result"
            on_record({"layer": todo[0], "bit_exact": False, "error": f"simulator crashed: {why}"})
            todo = todo[1:]


def evaluate(rec, est, tolerance=0.02, min_slack=16):
    """Reason a finished RTL record fails, or ``None``: not bit-exact / hung (the
    testbench's message), or cycles off the model by more than ``tolerance`` (relative to
    the RTL's) and ``min_slack`` cycles."""
    if not rec.get("bit_exact"):
        return rec.get("error", "failed")
    cyc = rec["cycles"]
    if abs(est - cyc) > max(min_slack, tolerance * cyc):
        return (f"RTL {cyc} cycles, model {est} ({100 * (est - cyc) / cyc:+.2f} %, allowed "
                f"{100 * tolerance:g} % / {min_slack} cycles)")
    return None


def fuzz(cfg, cases, sim="verilator", tolerance=0.02, min_slack=16, batch=100, progress=True,
         on_failure=None, records=None, dram=None):
    """Check ``cases`` (``[(spec, estimate)]``) on the fast model, then on the RTL.

    Returns ``{"cases", "passed", "failures": [repro...], "sim_cycles", "model_error",
    "wall_s", "results": [...]}``; each failure is a one-line-JSON-able repro
    ``{"config", "layer", "reason"}``, also passed to ``on_failure`` as it happens.
    """
    from tqdm import tqdm
    from ..errors import FabricError
    from .dram import DEFAULT_DRAM
    dram = dram or DEFAULT_DRAM
    t0 = time.monotonic()
    failures, results, errors = [], [], []

    def fail(spec, reason, **extra):
        rep = {"config": cfg.to_dict(), "layer": spec, "reason": reason, **extra}
        failures.append(rep)
        if on_failure:
            on_failure(rep)

    model_ok = []
    for spec, est in tqdm(cases, desc="fast model", unit="layer", file=sys.stderr, disable=not progress):
        try:
            why = check_model(cfg, spec)
        except FabricError as exc:
            why = f"fast model: {exc}"
        if why:
            fail(spec, why)
        else:
            model_ok.append((spec, est))
    est_of = {json.dumps(s, sort_keys=True): e for s, e in model_ok}
    bar = tqdm(total=len(model_ok), desc=f"RTL ({sim})", unit="layer", file=sys.stderr, disable=not progress)
    sim_cycles = 0

    def on_record(rec):
        nonlocal sim_cycles
        bar.update(1)
        spec = rec["layer"]
        est = est_of[json.dumps(spec, sort_keys=True)]
        why = evaluate(rec, est, tolerance, min_slack)
        res = {"layer": spec, "model_cycles": est, "rtl_cycles": rec.get("cycles"), "ok": why is None}
        results.append(res)
        if records is not None:
            records.write(json.dumps({**res, "counters": rec.get("counters")}) + "\n")
        if rec.get("bit_exact"):
            sim_cycles += rec["tb_cycles"]
            errors.append((est - rec["cycles"]) / rec["cycles"])
        if why:
            fail(spec, why, **({"rtl_cycles": rec["cycles"], "model_cycles": est} if rec.get("bit_exact") else {}))

    specs = [s for s, _ in model_ok]
    for i in range(0, len(specs), batch):
        run_rtl(cfg, specs[i:i + batch], sim, on_record, dram)
    bar.close()
    return {"config": cfg.to_dict(), "cases": len(cases), "passed": len(cases) - len(failures),
            "failures": failures, "simulator": sim, "dram": dram, "sim_cycles": sim_cycles,
            "wall_s": round(time.monotonic() - t0, 1),
            "model_error": {"max_abs": max((abs(e) for e in errors), default=0.0),
                            "mean": sum(errors) / len(errors) if errors else 0.0},
            "results": results}


#: The headline benchmark layer (scripts/bench_layer.py's defaults, benchmarks/bench_layer_8x8.json).
BENCH_LAYER = dict(cin=64, cout=64, k=3, stride=1, pad=0, hw=[18, 18], seed=0)


def scalesim_ws_cycles(layer, cfg):
    """SCALE-Sim's stall-free weight-stationary cycle count of a layer,
    ``ceil(K/R) * ceil(M/C) * (2R + C + Npx - 2) - 1``, and the physical limit
    ``ceil(K/R) * ceil(M/C) * Npx`` (one pixel per cycle per tile)."""
    oh, ow = layer.out_hw
    kh, kw = layer.kernel
    K = kh * kw * layer.cin
    npx = oh * ow
    tiles = math.ceil(K / cfg.rows) * math.ceil(layer.cout / cfg.cols)
    return tiles * (2 * cfg.rows + cfg.cols + npx - 2) - 1, tiles * npx
