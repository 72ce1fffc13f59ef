"""Fixed-protocol benchmarks on public data sets (``make benchmark NAME=<name> MODEL=<model> DATA_ROOT=<dir>``).

Each benchmark is a protocol (which items, drawn how, answered and scored how) applied unchanged to any model the
platform can name: a training run, a registered model version, or an open_clip image-text model. A protocol is
one module (a :class:`~apps.benchmarks.framework.protocol.Protocol` subclass) plus one ``configs/benchmark/<name>.yaml``
naming it; the shared runner (:mod:`apps.benchmarks.framework.runner`) does the rest for every protocol.
"""
