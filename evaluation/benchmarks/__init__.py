"""Fixed-protocol benchmarks on public data sets (``make benchmark NAME=<name> MODEL=<model>``).

Each benchmark is a protocol (which images, which draws, which metrics) applied to any model the platform can
name: a training run, a registered model version, or an open_clip image-text model.
"""
