"""The model zoo: every network dnnfab can load by name.

Two kinds of entries:

* **bundled** -- trained here, ONNX file shipped in this package next to a JSON file of
  the metrics measured when it was trained (``digits-cnn``, ``eeg-seizure``); retrain with
  ``scripts/train_*.py``.
* **onnx** -- the nine "light" ImageNet architectures that the installed ``onnx`` package
  ships under ``onnx/backend/test/data/light/`` for its backend tests. Their structure and
  shapes are the real networks', but every weight is a ``ConstantOfShape`` fill (e.g. all
  0.02): good for import, mapping, scheduling and performance work, meaningless outputs.

Names are matched case-insensitively and ignoring ``-``, ``_``, ``.`` and spaces, so
``ResNet-50``, ``resnet_50`` and ``light_resnet50`` all find ``resnet50``.
"""

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import ModelError

__all__ = ["list_models", "load_model", "model_path", "model_info", "model_names", "canonical_name"]

_HERE = Path(__file__).resolve().parent
_ONNX_LIGHT = "backend/test/data/light"


@dataclass(frozen=True)
class _Entry:
    name: str
    description: str
    source: str       # "bundled" | "onnx"
    file: str         # bundled: file in this package; onnx: file in onnx/<_ONNX_LIGHT>
    provenance: str
    task: str
    aliases: tuple = ()
    metrics_file: str = ""


# Their weights are ConstantOfShape fills, not trained values (see the module docstring).
_ZOO_PROVENANCE = "onnx package test data (Caffe2 export, placeholder weights)"

_ENTRIES = (
    _Entry("digits-cnn",
           "CNN for 8x8 handwritten digits, input pixel/16",
           "bundled", "digits_cnn.onnx",
           "trained here on sklearn load_digits (real data)",
           "classification, 10 classes", ("digits",), "digits_cnn.json"),
    _Entry("eeg-seizure",
           "1-D CNN seizure detector, 23-ch 1 s EEG, input uV/100",
           "bundled", "eeg_seizure.onnx",
           "trained here on SYNTHETIC EEG (datasets.eeg_windows)",
           "detection, 2 classes (background, seizure)", ("eeg",), "eeg_seizure.json"),
    _Entry("alexnet", "AlexNet (BVLC), with LRN",
           "onnx", "light_bvlc_alexnet.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes",
           ("bvlc-alexnet",)),
    _Entry("densenet121", "DenseNet-121",
           "onnx", "light_densenet121.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
    _Entry("inception-v1", "Inception v1 (GoogLeNet)",
           "onnx", "light_inception_v1.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes",
           ("googlenet",)),
    _Entry("inception-v2", "Inception v2 (BN-Inception)",
           "onnx", "light_inception_v2.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
    _Entry("resnet50", "ResNet-50",
           "onnx", "light_resnet50.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
    _Entry("shufflenet", "ShuffleNet v1",
           "onnx", "light_shufflenet.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
    _Entry("squeezenet", "SqueezeNet 1.0",
           "onnx", "light_squeezenet.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
    _Entry("vgg19", "VGG-19 (144 M weights once folded)",
           "onnx", "light_vgg19.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
    _Entry("zfnet512", "ZFNet-512, with LRN",
           "onnx", "light_zfnet512.onnx", _ZOO_PROVENANCE, "ImageNet architecture, 1000 classes"),
)


def _key(name):
    key = re.sub(r"[\s._-]", "", str(name).lower())
    return key[len("light"):] if key.startswith("light") and len(key) > len("light") else key


_BY_KEY = {}
for _e in _ENTRIES:
    for _n in (_e.name, *_e.aliases):
        _BY_KEY[_key(_n)] = _e


def model_names():
    """Canonical names of all zoo models, in listing order."""
    return [e.name for e in _ENTRIES]


def canonical_name(name):
    """The zoo's own name for ``name`` (an alias or spelling variant), or None."""
    entry = _BY_KEY.get(_key(name))
    return entry.name if entry else None


def _entry(name):
    entry = _BY_KEY.get(_key(name))
    if entry is None:
        raise ModelError(f"unknown model {name!r} (no zoo model or file of that name): use "
                         f"one of {', '.join(model_names())} or an .onnx path (see `dnnfab models`)")
    return entry


def _onnx_light_dir():
    try:
        import onnx
    except ImportError as exc:  # a runtime dependency, but say how to fix it
        raise ModelError("the onnx package is not installed: pip install 'onnx>=1.16,<2'") from exc
    return Path(onnx.__file__).resolve().parent / _ONNX_LIGHT


def model_path(name):
    """Path of the ONNX file behind ``name`` (bundled file or the onnx package's file)."""
    entry = _entry(name)
    base = _HERE if entry.source == "bundled" else _onnx_light_dir()
    path = base / entry.file
    if not path.is_file():
        if entry.source == "bundled":
            fix = f"reinstall dnnfab or regenerate it with scripts/train_{entry.file[:-5]}.py"
        else:
            fix = "install an onnx wheel that ships backend test data (pip install --force-reinstall onnx)"
        raise ModelError(f"model file of {entry.name!r} is missing ({path}): {fix}")
    return path


def load_model(name):
    """Load a zoo model by name and return a fresh ``onnx.ModelProto``."""
    import onnx

    path = model_path(name)
    try:
        return onnx.load(str(path))
    except Exception as exc:  # corrupt file: name it, not a protobuf traceback
        raise ModelError(f"cannot read model file {path}: {exc}; reinstall dnnfab/onnx") from exc


def _value_info_shape(vi):
    dims = vi.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims]


@lru_cache(maxsize=None)
def _signature(path_str):
    """(input name, input shape, input dtype, output names, output shapes, ops, opset) of a file."""
    import onnx

    model = onnx.load(path_str)
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    data_inputs = [i for i in graph.input if i.name not in inits]
    if len(data_inputs) != 1:
        raise ModelError(f"{path_str} has {len(data_inputs)} data inputs, the zoo expects one")
    x = data_inputs[0]
    ops = sorted({n.op_type for n in graph.node})
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return (x.name, tuple(_value_info_shape(x)),
            onnx.helper.tensor_dtype_to_np_dtype(x.type.tensor_type.elem_type).name,
            tuple(o.name for o in graph.output),
            tuple(tuple(_value_info_shape(o)) for o in graph.output),
            tuple(ops), opset)


def _metrics_summary(metrics):
    """One short line of the training-time metrics of a bundled model."""
    if "test_accuracy" in metrics:
        return f"top-1 {100 * metrics['test_accuracy']:.1f}% ({metrics['n_test']} held out)"
    test = metrics.get("test", {})
    if "sensitivity" in test:
        return (f"sens {100 * test['sensitivity']:.1f}% spec {100 * test['specificity']:.1f}% "
                f"({metrics['n_test']} held out)")
    return ""


def model_info(name):
    """Everything known about one model, as a plain dict.

    The keys of :func:`list_models` plus ``task``, ``aliases``, ``input_dtype``,
    ``output_shapes``, ``ops`` (sorted op types), ``opset`` and, for bundled models,
    ``metrics`` (the training-time JSON written by ``scripts/train_*.py``).
    """
    entry = _entry(name)
    info = {
        "name": entry.name,
        "source": entry.source,
        "input": None,
        "input_shape": None,
        "outputs": [],
        "description": entry.description,
        "accuracy": "",
        "provenance": entry.provenance,
        "path": None,
        "available": False,
        "task": entry.task,
        "aliases": list(entry.aliases),
    }
    try:
        path = model_path(entry.name)
    except ModelError as exc:
        info.update(error=str(exc), input_dtype=None, output_shapes=[], ops=[], opset=None)
        return info
    x, shape, dtype, outs, out_shapes, ops, opset = _signature(str(path))
    info.update(path=str(path), available=True, input=x, input_shape=list(shape),
                input_dtype=dtype, outputs=list(outs),
                output_shapes=[list(s) for s in out_shapes], ops=list(ops), opset=opset)
    if entry.metrics_file and (_HERE / entry.metrics_file).is_file():
        info["metrics"] = json.loads((_HERE / entry.metrics_file).read_text())
        info["accuracy"] = _metrics_summary(info["metrics"])
    elif entry.source == "onnx":
        info["accuracy"] = "n/a (untrained)"
    return info


_TABLE_KEYS = ("name", "source", "input", "input_shape", "outputs", "description", "accuracy",
               "provenance", "path", "available")


def list_models():
    """One flat dict per zoo model, in a stable order, ready for a table.

    Keys: ``name``; ``source`` (``"bundled"``: trained here, file in this package, or
    ``"onnx"``: from the installed onnx package, placeholder weights); ``input`` (name of
    the data input, the graph input that is not an initializer); ``input_shape`` (list of
    ints); ``outputs`` (output names); ``description``; ``accuracy`` (one line of the
    training-time metrics, "" if unknown); ``provenance``; ``path`` (the ONNX file);
    ``available`` (False if the file is missing: then ``input``/``path`` are None and
    ``error`` says why). Use :func:`model_info` for ops, opset and the full metrics.
    """
    rows = []
    for e in _ENTRIES:
        info = model_info(e.name)
        row = {k: info[k] for k in _TABLE_KEYS}
        if "error" in info:
            row["error"] = info["error"]
        rows.append(row)
    return rows
