#!/usr/bin/env python
"""Train ``eeg-seizure`` and write ``models/eeg_seizure.onnx`` + ``models/eeg_seizure.json``.

Data: **SYNTHETIC** EEG from :func:`dnnfab.models.datasets.eeg_windows` (no EEG corpus is
available offline): 30000 training windows (seed 0) and 1000 held-out windows (seed 1),
half of each with a spike-and-wave seizure. 23 bipolar channels, 1 s at 256 Hz.

Input ``eeg`` float32 [1, 23, 1, 256] = microvolts / 100, NCHW with the EEG channels as C
and time as W; output ``logits`` float32 [1, 2] (index 1 = seizure, argmax decides).

A 1-D CNN written as 2-D ONNX ops with [1, k] kernels (Conv, Relu, MaxPool,
GlobalAveragePool, Flatten, Gemm)::

    Conv 23->32 1x7 pad 3, Relu, MaxPool 1x4     -> 32x1x64
    Conv 32->32 1x5 pad 2, Relu, MaxPool 1x4     -> 32x1x16
    Conv 32->32 1x3 pad 1, Relu, GlobalAveragePool, Flatten, Gemm 32->2

Training: numpy only (scripts/_numpy_cnn.py), Adam with cosine decay, seeded; about
three minutes on an idle 2-core machine (generating the windows takes ~25 s of it; the
committed run took 21 min wall on a busy shared one), ~1.5 GB of RAM. The held-out
windows are used once, for the reported metrics. Run::

    python scripts/train_eeg_seizure.py            # rewrites the committed files
    python scripts/train_eeg_seizure.py --out /tmp
"""

import argparse
import hashlib
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _numpy_cnn as nn  # noqa: E402

from dnnfab.models import datasets  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SEED = 0  # weight init; batch order uses SEED + 1
HYPER = dict(epochs=10, batch=64, lr=3e-3, weight_decay=1e-4)


def build(rng):
    w = 32
    layers = [
        nn.Conv(rng, 23, w, (1, 7), (0, 3)), nn.Relu(), nn.MaxPool((1, 4)),
        nn.Conv(rng, w, w, (1, 5), (0, 2)), nn.Relu(), nn.MaxPool((1, 4)),
        nn.Conv(rng, w, 32, (1, 3), (0, 1)), nn.Relu(), nn.GlobalAveragePool(),
        nn.Flatten(), nn.Gemm(rng, 32, 2, gain=1.0),
    ]
    names = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
             "conv3", "relu3", "gap", "flatten", "fc"]
    return nn.Net(layers, names)


def rates(pred, y):
    tp = int(((pred == 1) & (y == 1)).sum())
    tn = int(((pred == 0) & (y == 0)).sum())
    fp = int(((pred == 1) & (y == 0)).sum())
    fn = int(((pred == 0) & (y == 1)).sum())
    return dict(accuracy=round((tp + tn) / len(y), 6), sensitivity=round(tp / (tp + fn), 6),
                specificity=round(tn / (tn + fp), 6), tp=tp, tn=tn, fp=fp, fn=fn)


def ort_logits(path, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "models", help="output directory")
    ap.add_argument("--epochs", type=int, default=HYPER["epochs"])
    ap.add_argument("--n-train", type=int, default=datasets.EEG_N_TRAIN)
    args = ap.parse_args(argv)

    t0 = time.time()
    x_tr, y_tr, x_te, y_te = datasets.eeg_split(n_train=args.n_train)
    print(f"generated {len(y_tr)} + {len(y_te)} synthetic windows in {time.time() - t0:.1f} s")
    rng = np.random.default_rng(SEED)
    net = build(rng)
    t0 = time.time()
    history = nn.train(net, x_tr, y_tr, epochs=args.epochs, batch=HYPER["batch"], lr=HYPER["lr"],
                       seed=SEED + 1, weight_decay=HYPER["weight_decay"])
    seconds = time.time() - t0

    train = rates(net.predict(x_tr).argmax(1), y_tr)
    doc = ("1-D CNN seizure detector trained on SYNTHETIC EEG (dnnfab.models.datasets.eeg_windows). "
           "Input 'eeg' [1,23,1,256] float32 = microvolts/100 (23 bipolar channels as C, 1 s at "
           "256 Hz as W); output 'logits' [1,2], index 1 = seizure. Not for clinical use.")
    model = net.to_onnx("eeg_seizure", "eeg", (1, 23, 1, 256), "logits", doc,
                        {"dataset": "SYNTHETIC: dnnfab.models.datasets.eeg_windows",
                         "normalization": "microvolts / 100", "classes": "background,seizure",
                         "channels": ",".join(datasets.EEG_CHANNELS), "sample_rate_hz": datasets.EEG_FS,
                         "training_script": "scripts/train_eeg_seizure.py"})
    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / "eeg_seizure.onnx"
    onnx_path.write_bytes(model.SerializeToString())

    test = rates(ort_logits(onnx_path, x_te).argmax(1), y_te)  # as the tests measure it
    metrics = {
        "model": "eeg-seizure",
        "onnx": onnx_path.name,
        "onnx_sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest(),
        "dataset": "SYNTHETIC EEG, dnnfab.models.datasets.eeg_windows (not recorded data)",
        "split": "train = eeg_windows(n_train, seed=0), test = eeg_windows(1000, seed=1) "
                 "= dnnfab.models.datasets.eeg_split()",
        "normalization": "x = microvolts / 100, float32, shape [1, 23, 1, 256]",
        "channels": list(datasets.EEG_CHANNELS),
        "sample_rate_hz": datasets.EEG_FS,
        "n_train": int(len(y_tr)),
        "n_test": int(len(y_te)),
        "n_test_seizure": int(y_te.sum()),
        "seeds": {"train_windows": datasets.EEG_TRAIN_SEED, "test_windows": datasets.EEG_TEST_SEED,
                  "init": SEED, "batches": SEED + 1},
        "hyperparameters": dict(HYPER, epochs=args.epochs, optimizer="Adam, cosine lr decay"),
        "parameters": int(sum(p.size for p in net.params())),
        "train": train,
        "test": test,
        "final_train_loss": round(history[-1], 6),
        "training_seconds": round(seconds, 1),
        "measured_with": "onnxruntime on the written ONNX file",
        "environment": {"python": platform.python_version(), "numpy": np.__version__},
    }
    (args.out / "eeg_seizure.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"wrote {onnx_path} ({onnx_path.stat().st_size} bytes): train {train}, test {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
