"""Adapters: one per native dataset layout, each turning it into a manifest (docs/rules.md §6).

Every adapter is a data source (``prepare() -> manifest path`` plus ``root`` and ``name``), so the data module
never knows which release it reads; ``configs/data/<name>.yaml`` selects one.
"""
