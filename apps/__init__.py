"""Applications: the commands that act on finished runs (evaluate, compare, score, register, serve, submit,
ensembles, benchmarks, the model card). The top layer: they may use ``training`` and ``evaluation``, which never
import them (docs/architecture.md, "Layers and data flow")."""
