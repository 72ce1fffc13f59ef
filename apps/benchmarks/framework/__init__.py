"""The benchmark framework: protocol types, the runner, sampling, encoders, tracking, the report, and the helpers
more than one protocol uses. It never imports a protocol; protocols are found through ``configs/benchmark/``."""
