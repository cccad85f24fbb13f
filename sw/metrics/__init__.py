"""The metric model: per layer and resource, latency, power and energy (see docs/metrics.md)."""

from .costs import RESOURCES, Option, LayerCost, NetworkCost, ResourceModel

__all__ = ["RESOURCES", "Option", "LayerCost", "NetworkCost", "ResourceModel"]
