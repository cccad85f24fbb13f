"""The metric model: per layer and resource, latency, power and energy (see docs/metrics.md)."""

from .costs import RESOURCES, Option, LayerCost, NetworkCost, ResourceModel
from .model import MetricModel, layer_macs, split_channels, DEFAULT_SPLITS

__all__ = ["RESOURCES", "Option", "LayerCost", "NetworkCost", "ResourceModel", "MetricModel",
           "layer_macs", "split_channels", "DEFAULT_SPLITS"]
