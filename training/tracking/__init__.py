"""The single tracking path: every run, metric and artifact goes through MLflow (DESIGN §4)."""
