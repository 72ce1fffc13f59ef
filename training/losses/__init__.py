"""Multi-label losses, each selectable as ``loss=<name>`` through ``configs/loss/<name>.yaml``."""

from training.losses.base import MultiLabelLoss

__all__ = ["MultiLabelLoss"]
