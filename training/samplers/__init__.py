"""Training-set samplers, each selectable as ``sampler=<name>`` through ``configs/sampler/<name>.yaml``."""
