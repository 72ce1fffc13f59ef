"""The single tracking path: every run, metric and artifact goes through MLflow (docs/rules.md §7)."""
