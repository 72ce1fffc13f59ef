"""Everything that produces a model: data, backbones, losses, samplers, the LightningModule, entry points."""
