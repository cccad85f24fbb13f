"""Checks every entry point of the runtime applies before it runs a network.

Where each layer runs is decided by :mod:`dnnfab.sw.compiler.placement` (re-exported
here); running whole networks is :class:`dnnfab.sw.runtime.session.InferenceSession`.
"""

import numpy as np

from ...errors import ConfigError
from ...hw.config import AcceleratorConfig
from ..compiler.placement import (FABRIC_OPS, Placement, to_conv_layer, op_label, place_layer,  # noqa: F401
                                  plan_network)
from ...errors import InputError as _InputError

__all__ = ["Placement", "FABRIC_OPS", "to_conv_layer", "op_label", "place_layer",
           "plan_network", "check_run_config", "check_finite"]


def check_finite(feed, what="input"):
    """Raise :class:`~dnnfab.errors.InputError` if an array of ``feed`` ({name: array})
    holds NaN or inf."""
    for name, x in feed.items():
        x = np.asarray(x)
        if x.dtype.kind in "fc":
            bad = ~np.isfinite(x)
            if bad.any():
                first = tuple(int(i) for i in np.argwhere(bad)[0])
                raise _InputError(f"{what} {name!r} holds {int(bad.sum())} NaN/inf value(s) "
                                  f"(first at index {first}); int8 quantization needs finite "
                                  "numbers: clean the data (e.g. np.nan_to_num) first")


def check_run_config(cfg: AcceleratorConfig, cli=False):
    """Raise :class:`ConfigError` unless networks can run on ``cfg`` as the contract says.

    The quantizer, the integer reference and the fast model implement int8 x int8 products
    with int32 accumulation only (the quantizer bounds every sum by 2^31); a configuration
    with other widths would still compute int8, so it is refused rather than ignored.
    ``cli``: name the settings as command-line options (``--input-bits 4``).
    """
    bad = [k for k, want in (("input_bits", 8), ("weight_bits", 8)) if getattr(cfg, k) != want]
    if cfg.acc_bits < 32:
        bad.append("acc_bits")
    if not bad:
        return

    def name(k, v=None):
        v = getattr(cfg, k) if v is None else v
        return f"--{k.replace('_', '-')} {v}" if cli else f"{k}={v}"

    fix = ", ".join(name(k, ">=32" if k == "acc_bits" else 8) for k in bad)
    raise ConfigError(f"{', '.join(name(k) for k in bad)}: networks run as int8 x int8 with "
                      "int32 accumulators only (the quantizer, the integer reference and the "
                      f"fast model have no other widths); use {fix} (the default) -- "
                      "generate and synth build other widths, cosim --top array simulates them")
