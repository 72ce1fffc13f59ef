"""A study's plots page: interactive figures for what Optuna can draw, the rest left out, one plotly.js."""

from __future__ import annotations

import optuna

from training.tuning.plots import write_plots_page


def _study(n_trials: int, report: bool) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="task1-default", sampler=optuna.samplers.RandomSampler(seed=0))

    def objective(trial):
        x, loss = trial.suggest_float("x", 0, 1), trial.suggest_categorical("loss", ["bce", "asl"])
        if report:
            for epoch in range(3):
                trial.report(x * (epoch + 1), epoch)
        return x + (loss == "asl")

    study.optimize(objective, n_trials=n_trials)
    return study


def test_every_plot_is_an_interactive_figure_and_plotly_is_inlined_once(tmp_path, caplog):
    path = tmp_path / "plots.html"
    with caplog.at_level("INFO", logger="training.tuning.plots"):
        sections = write_plots_page(_study(6, report=True), path)
    assert "skipped" not in caplog.text  # a one-objective study has no front, and no line says so
    page = path.read_text()
    assert sections == ["optimization_history", "param_importances", "parallel_coordinate", "intermediate_values"]
    for section in sections:
        assert f'<div id="plot-{section}"' in page
    assert page.count("Plotly.newPlot") == 4  # each figure drawn by the one inlined library
    assert page.count("plotly.js v") == 1 and "<script src=" not in page  # offline-safe, not four copies


def test_a_young_study_gets_the_plots_optuna_can_draw(tmp_path):
    sections = write_plots_page(_study(1, report=False), tmp_path / "plots.html")
    # Nothing was reported per epoch, so there are no intermediate values to draw: no empty frame either.
    assert sections == ["optimization_history", "param_importances", "parallel_coordinate"]
