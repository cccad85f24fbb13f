"""dnnfab.models: networks loadable by name, and the data they were trained on.

    >>> from dnnfab import models
    >>> [m["name"] for m in models.list_models()][:2]
    ['digits-cnn', 'eeg-seizure']
    >>> proto = models.load_model("digits-cnn")          # an onnx.ModelProto

Bundled (trained here, files in this package): ``digits-cnn`` (real 8x8 digits),
``eeg-seizure`` (trained on SYNTHETIC EEG). From the installed ``onnx`` package
(architectures with placeholder weights): ``alexnet``, ``densenet121``, ``inception-v1``,
``inception-v2``, ``resnet50``, ``shufflenet``, ``squeezenet``, ``vgg19``, ``zfnet512``.
See docs/models.md; data splits are in :mod:`dnnfab.models.datasets`.
"""

from .zoo import list_models, load_model, model_info, model_names, model_path

__all__ = ["list_models", "load_model", "model_info", "model_names", "model_path"]
