"""``dnnfab run``: the main job. A bundled model, quantized, accelerated, checked.

Defaults: the bundled ``digits-cnn`` (real 8x8 digits), int8 post-training quantization
calibrated on its training split, the default accelerator configuration and the fast model
backend. Prints a per-layer table (where each layer ran, MACs, fabric cycles, utilization,
time), the fabric-vs-CPU-reference bit-exactness, and accuracy on held-out data; ``--json``
prints one JSON object instead.
"""

import json
import time

import numpy as np

from ..errors import DnnfabError, ModelError

__all__ = ["register", "main_job"]

DEFAULT_MODEL = "digits-cnn"


def _data_for(name, graph, n_eval, n_calib):
    """(calibration feeds, eval inputs, eval labels or None) for a model."""
    from ..models import datasets
    inp = graph.inputs[0]
    if name == "digits-cnn":
        xtr, ytr, xte, yte = datasets.digits_split()
    elif name == "eeg-seizure":
        xtr, ytr, xte, yte = datasets.eeg_split(n_train=max(n_calib, 1), n_test=max(n_eval, 1))
    else:
        rng = np.random.default_rng(0)
        shape = tuple(inp.shape)
        xtr = rng.standard_normal((n_calib,) + shape[1:]).astype(np.float32)
        xte = rng.standard_normal((n_eval,) + shape[1:]).astype(np.float32)
        yte = None
    calib = [{inp.name: xtr[i:i + 1]} for i in range(min(n_calib, len(xtr)))]
    return calib, xte[:n_eval], (None if yte is None else yte[:n_eval])


def main_job(model=DEFAULT_MODEL, cfg=None, samples=32, calib=64, progress=True):
    import dnnfab
    from ..hw.config import AcceleratorConfig
    from .runtime import run_network
    cfg = cfg or AcceleratorConfig()
    t0 = time.monotonic()
    g = dnnfab.load(model)
    calib_feeds, xs, ys = _data_for(model, g, samples, calib)
    q = dnnfab.quantize(g, calibration=calib_feeds)
    inp = g.inputs[0].name
    out_name = g.outputs[0].name
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(xs), desc=f"{model} on fabric model", unit="img", leave=False)
    correct_fab = correct_float = 0
    exact = True
    first = None
    for i in range(len(xs)):
        feed = {inp: xs[i:i + 1]}
        res = run_network(q, feed, cfg, check=True)
        exact &= bool(res.bit_exact)
        if first is None:
            first = res
        if ys is not None:
            p = q.qtensors[out_name]
            y_fab = (res.outputs[out_name].astype(np.float32) - p.zero_point) * p.scale
            correct_fab += int(np.argmax(y_fab) == ys[i])
            correct_float += int(np.argmax(g.run(feed)[out_name]) == ys[i])
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    summary = {
        "model": model, "config": cfg.to_dict(), "backend": "model", "samples": len(xs),
        "bit_exact_vs_reference": exact,
        "fabric_cycles_per_inference": first.fabric_cycles,
        "fabric_ms_per_inference": round(first.fabric_ms, 4),
        "cpu_ms_per_inference": round(first.cpu_ms, 4),
        "accuracy_int8_fabric": (correct_fab / len(xs)) if ys is not None else None,
        "accuracy_float": (correct_float / len(xs)) if ys is not None else None,
        "faults": first.faults,
        "layers": first.to_dict()["layers"],
        "wall_s": round(time.monotonic() - t0, 2),
    }
    return summary, first


def cmd_run(args):
    from ..hw.cli import config_from_args
    cfg = config_from_args(args)
    summary, first = main_job(args.model, cfg, samples=args.samples, calib=args.calib,
                              progress=not args.json)
    if args.json:
        print(json.dumps(summary, indent=2, default=float))
        return 0
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"{args.model} on a {cfg.rows}x{cfg.cols} accelerator @ {cfg.clock_mhz:g} MHz (fast model)")
    rows = first.table()
    for h in rows[0]:
        t.add_column(h, justify="right" if h not in ("layer", "op", "where") else "left")
    for r in rows[1:]:
        t.add_row(*r)
    con = Console()
    con.print(t)
    s = summary
    con.print(f"fabric: {s['fabric_cycles_per_inference']:,} cycles = {s['fabric_ms_per_inference']:.3f} ms "
              f"per inference; CPU layers {s['cpu_ms_per_inference']:.3f} ms (measured)")
    con.print(f"bit-exact vs the integer reference on {s['samples']} samples: {s['bit_exact_vs_reference']}")
    if s["accuracy_int8_fabric"] is not None:
        con.print(f"top-1 accuracy: int8 on fabric {100 * s['accuracy_int8_fabric']:.1f}%, "
                  f"float {100 * s['accuracy_float']:.1f}% ({s['samples']} held-out samples)")
    return 0


def register(sub):
    from ..hw.cli import add_config_args
    p = sub.add_parser("run", help="run a model on the accelerator (default: bundled digits-cnn, fast model)")
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="zoo name or .onnx path (default digits-cnn)")
    add_config_args(p)
    p.add_argument("--samples", type=int, default=32, help="held-out inputs to run (default 32)")
    p.add_argument("--calib", type=int, default=64, help="calibration inputs (default 64)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_run)
