"""Write ``models/digits.npz``: the 8x8 digits and the split ``digits-cnn`` was trained on.

The main job (``dnnfab run``) needs the held-out digits and calibration images, and
scikit-learn is not a runtime dependency, so the data ships with the package. This script
is how the file was made (needs scikit-learn: ``pip install -e '.[train]'``)::

    python scripts/make_digits_data.py            # rewrites models/digits.npz
    python scripts/make_digits_data.py --check    # exit 1 if the file differs from sklearn's data

Contents (all integer, ~50 KB compressed):

* ``images``  uint8 [1797, 8, 8], pixel counts 0..16, in scikit-learn's order;
* ``target``  uint8 [1797], the digit;
* ``train_idx`` / ``test_idx``  int16, the rows of the stratified split
  ``train_test_split(test_size=0.2, random_state=0, stratify=target)`` (1437 / 360 rows);
* ``source``  a string naming the origin and the licence.

Data: scikit-learn's ``load_digits``, a copy of the test set (``optdigits.tes``) of the
UCI "Optical Recognition of Handwritten Digits" data set (E. Alpaydin, C. Kaynak, 1998;
https://doi.org/10.24432/C50P49), licensed CC BY 4.0 by the UCI Machine Learning
Repository. See docs/models.md.
"""

import argparse
import io
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "models" / "digits.npz"

SOURCE = ("UCI Optical Recognition of Handwritten Digits, test set optdigits.tes (E. Alpaydin, "
          "C. Kaynak, 1998; https://doi.org/10.24432/C50P49; CC BY 4.0), as shipped by "
          "scikit-learn {version} (sklearn.datasets.load_digits); split: "
          "train_test_split(test_size=0.2, random_state=0, stratify=target)")


def build():
    import sklearn
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images
    assert images.min() >= 0 and images.max() <= 16 and np.array_equal(images, np.round(images))
    target = digits.target
    idx = np.arange(len(target))
    train_idx, test_idx = train_test_split(idx, test_size=0.2, random_state=0, stratify=target)
    return dict(images=images.astype(np.uint8), target=target.astype(np.uint8),
                train_idx=train_idx.astype(np.int16), test_idx=test_idx.astype(np.int16),
                source=np.array(SOURCE.format(version=sklearn.__version__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the shipped file, write nothing")
    ap.add_argument("-o", "--output", type=Path, default=OUT)
    args = ap.parse_args(argv)
    data = build()
    if args.check:
        with np.load(args.output) as old:
            same = all(np.array_equal(old[k], v) for k, v in data.items() if k != "source")
        print(f"{args.output}: {'matches' if same else 'DIFFERS FROM'} scikit-learn's digits and split")
        return 0 if same else 1
    buf = io.BytesIO()
    np.savez_compressed(buf, **data)
    args.output.write_bytes(buf.getvalue())
    print(f"wrote {args.output} ({len(buf.getvalue())} bytes): {len(data['train_idx'])} train, "
          f"{len(data['test_idx'])} test images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
