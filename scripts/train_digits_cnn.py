#!/usr/bin/env python
"""Train ``digits-cnn`` and write ``models/digits_cnn.onnx`` + ``models/digits_cnn.json``.

Data: scikit-learn's bundled 8x8 digits (real handwriting, 1797 images), split by
:func:`dnnfab.models.datasets.digits_split` (stratified, ``random_state=0``, 20 % test:
1437 train / 360 test). Input ``image`` float32 [1, 1, 8, 8] = pixels / 16; output
``logits`` float32 [1, 10] (no softmax: argmax is the digit).

Network (ONNX ops Conv, Relu, MaxPool, Flatten, Gemm only)::

    Conv 1->16 3x3 pad 1, Relu, MaxPool 2x2      -> 16x4x4
    Conv 16->32 3x3 pad 1, Relu, MaxPool 2x2     -> 32x2x2
    Flatten, Gemm 128->64, Relu, Gemm 64->10

Training: numpy only (scripts/_numpy_cnn.py), Adam with cosine decay, seeded; takes
about half a minute on one CPU core. The test split is used once, for the reported
metrics, never for model selection. Run from anywhere::

    python scripts/train_digits_cnn.py            # rewrites the committed files
    python scripts/train_digits_cnn.py --out /tmp # write elsewhere
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
SEED = 0  # weight init and batch order
HYPER = dict(epochs=60, batch=32, lr=3e-3, weight_decay=1e-4)


def build(rng):
    layers = [
        nn.Conv(rng, 1, 16, (3, 3), (1, 1)), nn.Relu(), nn.MaxPool((2, 2)),
        nn.Conv(rng, 16, 32, (3, 3), (1, 1)), nn.Relu(), nn.MaxPool((2, 2)),
        nn.Flatten(), nn.Gemm(rng, 128, 64), nn.Relu(), nn.Gemm(rng, 64, 10, gain=1.0),
    ]
    names = ["conv1", "relu1", "pool1", "conv2", "relu2", "pool2",
             "flatten", "fc1", "relu3", "fc2"]
    return nn.Net(layers, names)


def shift(rng, xb):
    """Augmentation: shift each image by up to one pixel (zero fill)."""
    out = np.zeros_like(xb)
    dy, dx = rng.integers(-1, 2, size=(2, len(xb)))
    for i in range(len(xb)):
        src = xb[i, 0]
        out[i, 0, max(dy[i], 0):8 + min(dy[i], 0), max(dx[i], 0):8 + min(dx[i], 0)] = \
            src[max(-dy[i], 0):8 - max(dy[i], 0), max(-dx[i], 0):8 - max(dx[i], 0)]
    return out


def ort_logits(path, x):
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "models", help="output directory")
    ap.add_argument("--epochs", type=int, default=HYPER["epochs"])
    args = ap.parse_args(argv)

    x_tr, y_tr, x_te, y_te = datasets.digits_split()
    rng = np.random.default_rng(SEED)
    net = build(rng)
    t0 = time.time()
    history = nn.train(net, x_tr, y_tr, epochs=args.epochs, batch=HYPER["batch"], lr=HYPER["lr"],
                       seed=SEED + 1, weight_decay=HYPER["weight_decay"], augment=shift)
    seconds = time.time() - t0

    train_acc = float((net.predict(x_tr).argmax(1) == y_tr).mean())
    doc = ("Small CNN for scikit-learn's 8x8 handwritten digits. Input 'image' [1,1,8,8] "
           "float32 = pixel/16 in [0,1]; output 'logits' [1,10], argmax = digit.")
    model = net.to_onnx("digits_cnn", "image", (1, 1, 8, 8), "logits", doc,
                        {"dataset": "sklearn.datasets.load_digits", "normalization": "pixel / 16",
                         "classes": "0,1,2,3,4,5,6,7,8,9", "training_script": "scripts/train_digits_cnn.py"})
    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / "digits_cnn.onnx"
    onnx_path.write_bytes(model.SerializeToString())

    # Metrics are measured on the written file with onnxruntime, the same way the tests do.
    pred = ort_logits(onnx_path, x_te).argmax(1)
    test_acc = float((pred == y_te).mean())
    confusion = np.zeros((10, 10), dtype=int)
    np.add.at(confusion, (y_te, pred), 1)
    metrics = {
        "model": "digits-cnn",
        "onnx": onnx_path.name,
        "onnx_sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest(),
        "dataset": "sklearn.datasets.load_digits (real, 1797 images of 8x8 pixels, 16 grey levels)",
        "split": "sklearn train_test_split(test_size=0.2, random_state=0, stratify=y) "
                 "= dnnfab.models.datasets.digits_split()",
        "normalization": "x = pixel / 16, float32, shape [1, 1, 8, 8]",
        "n_train": int(len(y_tr)),
        "n_test": int(len(y_te)),
        "seeds": {"split": datasets.DIGITS_SEED, "init": SEED, "batches_and_augmentation": SEED + 1},
        "hyperparameters": dict(HYPER, epochs=args.epochs, optimizer="Adam, cosine lr decay",
                                augmentation="random shift by up to 1 pixel"),
        "parameters": int(sum(p.size for p in net.params())),
        "train_accuracy": round(train_acc, 6),
        "test_accuracy": round(test_acc, 6),
        "test_errors": int((pred != y_te).sum()),
        "test_confusion": confusion.tolist(),
        "final_train_loss": round(history[-1], 6),
        "training_seconds": round(seconds, 1),
        "measured_with": "onnxruntime on the written ONNX file",
        "environment": {"python": platform.python_version(), "numpy": np.__version__},
    }
    (args.out / "digits_cnn.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"wrote {onnx_path} ({onnx_path.stat().st_size} bytes): "
          f"train {train_acc:.4f}, test {test_acc:.4f} ({metrics['test_errors']} errors of {len(y_te)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
