"""``dnnfab run``: the main job. A bundled model, quantized, accelerated, checked.

Defaults: the bundled ``digits-cnn`` (real 8x8 digits), int8 post-training quantization
calibrated on its training split, the default accelerator configuration and the fast model
backend. Prints a per-layer table (where each layer ran and, for a CPU layer, why not on
the fabric; MACs, fabric cycles, utilization, time), the fabric-vs-CPU-reference
bit-exactness, and accuracy on held-out data; ``--json`` prints one JSON object instead.

Data: ``digits-cnn`` and ``eeg-seizure`` bring their own (training split for calibration,
held-out split for the run). Any other model is calibrated on ``--calibration FILE``
(``.npy``: an array of N samples of the one input; ``.npz``: one such array per input
name; a directory: every ``.npy``/``.npz`` in it, in name order) and runs on those
samples; without it, on random standard-normal inputs, which a note on stderr says.
``--input-shape NAME=D0,D1,..`` fixes dynamic input dimensions.
"""

import json
import os
import sys
import time

import numpy as np

from ...errors import DnnfabError, InputError

__all__ = ["register", "main_job", "load_samples"]

DEFAULT_MODEL = "digits-cnn"
DEFAULT_CALIB = 64


def _note(msg):
    print(f"dnnfab: note: {msg}", file=sys.stderr)


def _zoo_name(model):
    """Canonical zoo name of ``model`` or None (a path, or not a zoo model)."""
    if not isinstance(model, str) or os.path.exists(model):
        return None
    from ...models.zoo import canonical_name
    return canonical_name(model)


# ------------------------------------------------------------------------ data files
def _load_one(path, names):
    """{input name: array} from one .npy / .npz file."""
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        else:
            arrays = {None: np.load(path, allow_pickle=False)}
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{path}: not a readable numpy file ({str(exc).splitlines()[0]}); "
                         "save it with np.save / np.savez") from None
    if None in arrays or (len(names) == 1 and len(arrays) == 1):
        if len(names) != 1:
            raise InputError(f"{path}: the model has inputs {names}; use an .npz with one "
                             "array per input name (np.savez(path, **{name: array}))")
        return {names[0]: next(iter(arrays.values()))}
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InputError(f"{path}: holds arrays {sorted(arrays)}, the model's inputs are "
                         f"{names}; name the arrays after the inputs")
    return {n: arrays[n] for n in names}


def load_samples(path, graph):
    """Samples for ``graph`` from ``path`` (``.npy``, ``.npz`` or a directory of them).

    Returns ``{input name: float32 array [N, *input_shape[1:]]}``; one sample may also be
    stored without the leading sample axis. Raises :class:`InputError` naming the file and
    the fix for a missing file, a wrong shape or dtype, or NaN/inf values.
    """
    from .network import check_finite
    names = [t.name for t in graph.inputs]
    shapes = {t.name: tuple(t.shape) for t in graph.inputs}
    if not os.path.exists(path):
        raise InputError(f"file not found: {path}; pass a .npy file, an .npz file or a "
                         "directory of them")
    if os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if f.endswith((".npy", ".npz")))
        if not files:
            raise InputError(f"{path}: the directory holds no .npy or .npz files; save "
                             "samples with np.save")
    elif path.endswith((".npy", ".npz")):
        files = [path]
    else:
        raise InputError(f"{path}: expected a .npy file, an .npz file or a directory of them "
                         "(save samples with np.save / np.savez)")
    parts = {n: [] for n in names}
    for f in files:
        for n, a in _load_one(f, names).items():
            a = np.asarray(a)
            if a.dtype.kind not in "fiub":
                raise InputError(f"{f}: array {n!r} has dtype {a.dtype}; save numbers "
                                 "(float32) for the model input")
            want = shapes[n][1:]
            if tuple(a.shape) == want:
                a = a[None]
            elif tuple(a.shape[1:]) != want:
                raise InputError(f"{f}: array {n!r} has shape {list(a.shape)}; input {n!r} "
                                 f"needs [N, {', '.join(map(str, want))}] (N samples)")
            check_finite({n: a}, what=f"{f}: array")
            parts[n].append(a.astype(np.float32))
    out = {n: np.concatenate(parts[n]) for n in names}
    counts = {n: len(a) for n, a in out.items()}
    if len(set(counts.values())) != 1:
        raise InputError(f"{path}: the inputs have different sample counts {counts}; give "
                         "every input the same number of samples")
    if not next(iter(counts.values())):
        raise InputError(f"{path}: holds no samples (an axis of length 0); save at least one")
    return out


def _feeds(graph, arrays, n=None):
    """Feeds of the graph's batch size from {name: [N, ...]} (the first ``n`` batches)."""
    b = graph.inputs[0].shape[0]
    total = len(next(iter(arrays.values()))) // b
    n = total if n is None else min(n, total)
    return [{k: v[i * b:(i + 1) * b] for k, v in arrays.items()} for i in range(n)]


def _random(graph, n, seed):
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal((n * t.shape[0],) + tuple(t.shape[1:])).astype(np.float32)
            for t in graph.inputs}


def _data_for(zoo, label, graph, n_eval, n_calib, calibration):
    """(calibration feeds, eval feeds, eval labels or None, description) for a model.

    ``n_calib`` None means "the default" (64 for bundled and random data, every sample
    of a ``calibration`` file).
    """
    b = graph.inputs[0].shape[0]
    desc = {}
    ys = None
    if calibration is not None:
        calib_arrays = load_samples(calibration, graph)
        n_have = len(next(iter(calib_arrays.values()))) // b
        if n_calib is not None and n_calib > n_have:
            raise DnnfabError(f"--calib {n_calib}: {calibration} holds {n_have} samples; use "
                              f"--calib {n_have} or fewer")
        calib = _feeds(graph, calib_arrays, n_calib)
        desc["calibration"] = f"{len(calib)} samples from {calibration}"
    n_calib = DEFAULT_CALIB if n_calib is None else n_calib
    if zoo in ("digits-cnn", "eeg-seizure"):
        from ...models import datasets
        inp = graph.inputs[0].name
        if zoo == "digits-cnn":
            xtr, _, xte, yte = datasets.digits_split()
            what = "digits"
        else:
            xtr, _, xte, yte = datasets.eeg_split(n_train=max(n_calib, 1), n_test=max(n_eval, 1))
            what = "synthetic EEG windows"
        for flag, n, have, split in (("--samples", n_eval, len(xte), "held-out"),
                                     ("--calib", n_calib, len(xtr), "training")):
            if calibration is not None and flag == "--calib":
                continue
            if n > have:
                raise DnnfabError(f"{flag} {n}: {zoo} has {have} {split} {what}; use {flag} "
                                  f"{have} or fewer")
        if calibration is None:
            calib = [{inp: xtr[i:i + 1]} for i in range(n_calib)]
            desc["calibration"] = f"{n_calib} {what} of the training split"
        xs = [{inp: xte[i:i + 1]} for i in range(n_eval)]
        ys = yte[:n_eval]
        desc["inputs"] = f"{n_eval} held-out {what}"
        return calib, xs, ys, desc
    if calibration is not None:
        if n_eval > len(calib):
            raise DnnfabError(f"--samples {n_eval}: {calibration} holds {len(calib)} samples; "
                              f"use --samples {len(calib)} or fewer")
        xs = calib[:n_eval]
        desc["inputs"] = f"the first {n_eval} calibration samples (no labels: accuracy not measured)"
        _note(f"{label} has no held-out data here: running the first {n_eval} of the "
              f"{len(calib)} calibration samples from {calibration} (no labels, so no accuracy)")
        return calib, xs, None, desc
    calib = _feeds(graph, _random(graph, n_calib, seed=0))
    xs = _feeds(graph, _random(graph, n_eval, seed=1))
    desc["calibration"] = f"{n_calib} random standard-normal input{'s' * (n_calib != 1)}"
    desc["inputs"] = f"{n_eval} random standard-normal input{'s' * (n_eval != 1)}"
    _note(f"no data for {label}: calibrating on {n_calib} random standard-normal inputs and "
          f"running {n_eval} more, so its int8 scales are not those of real data; pass "
          "--calibration data.npy|.npz|DIR")
    return calib, xs, None, desc


# ------------------------------------------------------------------------ the job
def _check_counts(samples, calib):
    if samples is None or samples < 1:
        raise DnnfabError(f"--samples {samples}: run at least one sample (--samples 1 or more)")
    if calib is not None and calib < 1:
        raise DnnfabError(f"--calib {calib}: calibrate on at least one sample (--calib 1 or more)")


def main_job(model=DEFAULT_MODEL, cfg=None, samples=32, calib=None, progress=True,
             calibration=None, input_shapes=(), require_fabric=False):
    """Quantize ``model``, run ``samples`` inputs through an :class:`InferenceSession` (the
    fabric model backend), check each against the integer reference.

    Returns ``(summary dict, first)``: ``first.layers`` the per-layer records and
    ``first.outputs`` the int8 outputs of the first sample. ``calibration``: a
    path for :func:`load_samples`; ``input_shapes``: ``--input-shape`` strings.
    """
    import dnnfab
    from ...hw.config import AcceleratorConfig
    from ..cpu.reference import run_reference
    from .cli import load_for_cli
    from .network import check_run_config
    from .session import InferenceSession
    cfg = cfg or AcceleratorConfig()
    _check_counts(samples, calib)
    check_run_config(cfg)
    t0 = time.monotonic()
    g = load_for_cli(model, input_shape_specs=input_shapes)
    zoo = _zoo_name(model)
    calib_feeds, xs, ys, desc = _data_for(zoo, model, g, samples, calib, calibration)
    q = dnnfab.quantize(g, calibration=calib_feeds)
    sess = InferenceSession(q, config=cfg, require_fabric=require_fabric)
    sess.compile()
    out_name = g.outputs[0].name
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(xs), desc=f"{model} on fabric model", unit="img", leave=False,
                   disable=None)
    correct_fab = correct_float = 0
    exact = True
    first = None
    first_out = None
    faults = []
    run_s = []
    for i, feed in enumerate(xs):
        t1 = time.perf_counter()
        out = sess.run_int(feed)
        run_s.append(time.perf_counter() - t1)
        ref = run_reference(q, q.quantize_inputs(feed), options=sess.options)
        exact &= all(np.array_equal(out[k], ref[k]) for k in ref)
        faults += sess.faults
        sess.faults = []
        if first is None:
            first, first_out = sess.profile(), out
        if ys is not None:
            p = q.qtensors[out_name]
            y_fab = (out[out_name].astype(np.float32) - p.zero_point) * p.scale
            correct_fab += int(np.argmax(y_fab) == ys[i])
            correct_float += int(np.argmax(g.run(feed)[out_name]) == ys[i])
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    ops = {L.name: L.describe_op() for L in g.layers}
    for r in first:
        r["op"] = ops.get(r["name"], r["op"])
        r["where"] = r["target"]          # the key earlier versions of this JSON used
    fab = [r for r in first if r["target"] == "fabric"]
    net = sess.net
    summary = {
        "model": zoo or model, "config": cfg.to_dict(), "backend": "model", "samples": len(xs),
        "calibration": desc["calibration"], "inputs": desc["inputs"],
        "bit_exact_vs_reference": bool(exact),
        "fabric_cycles_per_inference": sum(r["cycles"] for r in fab),
        "fabric_ms_per_inference": round(sum(r["ms"] for r in fab), 4),
        "cpu_ms_per_inference": round(sum(r["ms"] for r in first if r["target"] != "fabric"), 4),
        "fabric_launches_per_inference": len(net.runs),
        "fabric_efficiency": round(net.efficiency(), 4),
        "dram_bytes": net.dram_bytes,
        "compile_s": round(sess.compile_s, 3),
        "session_run_ms": round(1e3 * min(run_s), 3),
        "accuracy_int8_fabric": (correct_fab / len(xs)) if ys is not None else None,
        "accuracy_float": (correct_float / len(xs)) if ys is not None else None,
        "faults": faults,
        "layers": first,
        "wall_s": round(time.monotonic() - t0, 2),
    }
    sess.close()
    from types import SimpleNamespace
    return summary, SimpleNamespace(layers=first, outputs=first_out)


def _table_rows(layers):
    rows = [["layer", "op", "where", "MACs", "cycles", "util", "fabric ms", "cpu ms",
             "why not fabric"]]
    for r in layers:
        fab = r["target"] == "fabric"
        rows.append([r["name"], r["op"], r["target"], f"{r['macs']:,}",
                     f"{r['cycles']:,}" if fab else "", f"{r['utilization']:.2f}" if fab else "",
                     f"{r['ms']:.3f}" if fab else "", "" if fab else f"{r['ms']:.3f}",
                     r["error"] or r["reason"]])
    return rows


def cmd_run(args):
    from ...gencli import config_from_args
    from .network import check_run_config
    _check_counts(args.samples, args.calib)
    cfg = config_from_args(args)
    check_run_config(cfg, cli=True)
    summary, first = main_job(args.model, cfg, samples=args.samples, calib=args.calib,
                              progress=not args.json, calibration=args.calibration,
                              input_shapes=args.input_shape, require_fabric=args.require_fabric)
    if args.json:
        print(json.dumps(summary, indent=2, default=float))
        return 0
    from rich.table import Table
    from ...console import print_table
    s = summary
    t = Table(title=f"{s['model']} on a {cfg.rows}x{cfg.cols} accelerator @ {cfg.clock_mhz:g} MHz "
                    "(fast model)")
    rows = _table_rows(first.layers)
    for h in rows[0]:
        t.add_column(h, justify="left" if h in ("layer", "op", "where", "why not fabric") else "right")
    for r in rows[1:]:
        t.add_row(*r)
    print_table(t)
    n_cpu = sum(1 for r in first.layers if r["target"] != "fabric")
    print(f"fabric: {s['fabric_cycles_per_inference']:,} cycles = {s['fabric_ms_per_inference']:.3f} ms "
          f"per inference in {s['fabric_launches_per_inference']} launches (efficiency "
          f"{s['fabric_efficiency']:.2f}); {n_cpu} CPU layers {s['cpu_ms_per_inference']:.3f} ms "
          "(measured)")
    print(f"calibration: {s['calibration']}; inputs: {s['inputs']}")
    print(f"bit-exact vs the integer reference on {s['samples']} samples: {s['bit_exact_vs_reference']}")
    if s["accuracy_int8_fabric"] is not None:
        print(f"top-1 accuracy: int8 on fabric {100 * s['accuracy_int8_fabric']:.1f}%, "
              f"float {100 * s['accuracy_float']:.1f}% ({s['samples']} held-out samples)")
    return 0


RUN_DESCRIPTION = (
    "Quantize a model to int8, run its conv/GEMM layers on the accelerator's bit-exact fast "
    "model (the rest on the CPU), check the result against the integer reference and print "
    "a per-layer table. digits-cnn and eeg-seizure bring their own data; other models are "
    "calibrated on --calibration DATA (.npy: N samples of the one input; .npz: one array per "
    "input name; a directory of such files) and run on those samples, or else on random "
    "inputs (a note says so).")


def register(sub):
    from ...gencli import add_config_args
    from .cli import add_input_shape_arg
    p = sub.add_parser("run", help="run a model on the accelerator (default: bundled digits-cnn, fast model)",
                       description=RUN_DESCRIPTION)
    p.add_argument("model", nargs="?", default=DEFAULT_MODEL, help="zoo name or .onnx path (default digits-cnn)")
    add_config_args(p)
    p.add_argument("--samples", type=int, default=32, help="inputs to run (default 32)")
    p.add_argument("--calib", type=int, default=None,
                   help=f"calibration samples (default {DEFAULT_CALIB}; all of a --calibration file)")
    p.add_argument("--calibration", metavar="DATA", default=None,
                   help="calibration samples: .npy (one input), .npz (one array per input) or a "
                        "directory of them")
    add_input_shape_arg(p)
    p.add_argument("--require-fabric", action="store_true",
                   help="fail (naming the limit) if a conv/GEMM does not map onto the config "
                        "instead of running it on the CPU")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_run)
