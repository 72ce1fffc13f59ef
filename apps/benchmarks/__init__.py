"""Fixed-protocol benchmarks on public data sets (``make benchmark NAME=<name> MODEL=<model> DATA_ROOT=<dir>``).

Each benchmark is a protocol (which items, drawn how, answered and scored how) applied unchanged to any model the
platform can name: a training run, a registered model version, or an open_clip image-text model. A protocol is
one module or folder named after its ``configs/benchmark/<name>.yaml`` (a
:class:`~apps.benchmarks.framework.protocol.Protocol` subclass, with the readers and scorers only it uses beside
it); the shared framework (:mod:`apps.benchmarks.framework`) does the rest for every protocol.
"""
