"""Everything that judges a model: metrics, bootstrap, breakdowns, reports, registry and submission."""
