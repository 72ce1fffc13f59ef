"""The source heterogeneity report through ``make data-check``'s entry point: on a two-source fixture (offline),
and on the real NIH images of ../shared/data/nih-bbox (realdata), checked against the release's own table."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import PROJECT_ROOT, shared_data
from training.data.heterogeneity import measure


def data_check(*overrides: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "training.data_check", *overrides], cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def section(stdout: str) -> str:
    return stdout.split("== source heterogeneity\n", 1)[1].split("\n== ", 1)[0]


def test_data_check_prints_the_section_per_source(make_manifest, run_env):
    path = make_manifest(n=12)
    table = pd.read_csv(path, dtype=str, keep_default_na=False)
    table["source"] = ["centre_a", "centre_b"] * 6
    table["view"] = ["PA", "AP Supine", "AP", "L"] * 3
    table.to_csv(path, index=False)
    done = data_check("data=manifest", f"data.source.manifest={path}", "heterogeneity.sample=4", env=run_env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    text = section(done.stdout)
    rows = {line.split()[0]: line.split()[1:] for line in text.split("\n\n")[0].splitlines()}
    assert rows["source"] == ["centre_a", "centre_b"] and rows["images"] == ["6", "6"]
    assert rows["measured"] == ["4", "4"] and rows["width"] == ["x", "height", "32.0", "x", "32.0", "32.0", "x", "32.0"]
    assert rows["PA"] == ["%", "50.0", "0.0"] and rows["AP"] == ["%", "50.0", "50.0"]
    assert rows["lateral"] == ["%", "0.0", "50.0"]
    assert "seeded sample (seed 0) of at most 4 image(s) per source" in text


@pytest.mark.realdata
def test_nih_bbox_figures_match_the_release_table(tmp_path, run_env):
    """880 NIH images resized to 512 px, PA 478 / AP 402 by ``Data_Entry_2017_v2020.csv``."""
    root = shared_data("nih-bbox")
    entries = pd.read_csv(root / "Data_Entry_2017_v2020.csv", dtype=str)
    done = data_check("data=nih14", f"data.root={root}", f"data.source.out_dir={tmp_path}/m", env=run_env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in section(done.stdout).split("\n\n")[0].splitlines()}
    assert rows["source"] == ["nih"] and rows["images"] == ["880"] and rows["measured"] == ["500"]
    assert rows["width"] == ["x", "height", "512.0", "x", "512.0"] and rows["MP"] == ["0.262"]
    assert rows["AP"] == ["%", f"{100 * 402 / 880:.1f}"] and rows["PA"] == ["%", f"{100 * 478 / 880:.1f}"]

    table = pd.DataFrame({"path": "images/" + entries["Image Index"], "view": entries["View Position"],
                          "source": "nih"})  # fmt: skip
    (every,) = measure(table, root, sample=None).sources
    assert every.sampled == 880 and every.unreadable == 0 and (every.width, every.height) == (512.0, 512.0)
    assert every.views["AP"] * 880 == pytest.approx((entries["View Position"] == "AP").sum()) == 402
    # Radiographs, not blanks or saturated frames: near the paper's NIH figures (mean 0.450, SD 0.246) though these
    # are the 880 box images, downsized.
    assert 0.40 < every.mean < 0.55 and 0.20 < every.sd < 0.30
