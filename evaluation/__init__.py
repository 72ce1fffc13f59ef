"""Judging predictions: metrics and their registry, bootstrap, breakdowns, calibration, thresholds, perturbation and
TTA, the test phase and its reports. The bottom layer: it imports neither ``training`` nor ``apps``
(docs/architecture.md, "Layers and data flow")."""
