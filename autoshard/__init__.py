"""autoshard: plans how every tensor and op of a model is split across a device mesh."""

__version__ = "0.1.0"
