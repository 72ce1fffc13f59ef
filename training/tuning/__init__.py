"""Hyperparameter tuning with Optuna: search spaces, studies, trials as tracked runs, study reports."""
