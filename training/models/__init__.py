"""Backbones and the LightningModule."""
