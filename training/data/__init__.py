"""Datasets: manifests, sources (real releases and the built-in synthetic set), images and the data module."""
