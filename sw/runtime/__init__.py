"""Layer 10, the top of the host side: the public API (:mod:`.api`: ``dnnfab.load`` /
``dnnfab.quantize``), placement and input checks (:mod:`.network`), running a network on fabric + CPU (:mod:`.session`: ``InferenceSession``) and
the command line (:mod:`.cli`, :mod:`.runcli`). May import every layer below it
(docs/architecture.md)."""

from ..cpu.options import Options  # noqa: F401  (how the CPU layers run; passed down explicitly)
from .network import (Placement, FABRIC_OPS, place_layer, plan_network,  # noqa: F401
                      check_run_config, check_finite, op_label, to_conv_layer)
from .session import InferenceSession  # noqa: F401
