"""Acquisition balance: header values read from real DICOM files, and the chi-square against scipy on hand tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import chi2_contingency

from apps.benchmarks.reveal.acquisition import FIELDS, MISSING, balance, counts, format_balance, read_characteristics
from tests import dicom_files


def write_dicom(path, **tags):
    """A 4x4 12-bit file with the given header tags: only the header matters here."""
    return dicom_files.write_dicom(path, np.zeros((4, 4), np.uint16), tags=tags)


def test_header_values_are_read(tmp_path):
    paths = [
        write_dicom(tmp_path / "a.dcm", Manufacturer="ACME", ManufacturerModelName="X1", DetectorType="DIRECT",
                    ViewPosition="PA", KVP="120", Exposure=4, PixelSpacing=["0.1394", "0.1394"]),
        write_dicom(tmp_path / "b.dcm", Manufacturer="Other Corp ", ViewPosition="AP", KVP="85.5",
                    PixelSpacing=["0.1", "0.2"]),  # no model, detector or exposure; anisotropic pixels
        write_dicom(tmp_path / "c.dcm", Manufacturer="ACME", ViewPosition="", KVP="110", Exposure=2,
                    PixelSpacing=["0.2", "0.2"]),  # an empty tag counts as missing
    ]  # fmt: skip
    frame = read_characteristics(paths)
    assert list(frame.columns) == list(FIELDS)
    assert list(frame.index) == [str(p) for p in paths]
    a, b, c = (frame.loc[str(p)] for p in paths)
    assert (a["Manufacturer"], a["ManufacturerModelName"], a["DetectorType"], a["ViewPosition"]) == (
        "ACME", "X1", "DIRECT", "PA"
    )  # fmt: skip
    assert (a["KVP"], a["Exposure"], a["PixelSpacing"]) == (120.0, 4.0, 0.139)  # row spacing to 3 decimals
    assert b["Manufacturer"] == "Other Corp"  # DICOM's trailing padding is not part of the name
    assert b["KVP"] == 85.5 and b["PixelSpacing"] == "0.1 x 0.2"
    assert pd.isna(b["ManufacturerModelName"]) and pd.isna(b["DetectorType"]) and pd.isna(b["Exposure"])
    assert pd.isna(c["ViewPosition"]) and c["PixelSpacing"] == 0.2


def test_a_file_that_is_not_dicom_is_named(tmp_path):
    good = write_dicom(tmp_path / "good.dcm", Manufacturer="ACME")
    bad = tmp_path / "notes.txt"
    bad.write_text("not an image\n" * 20)
    with pytest.raises(ValueError, match="notes.txt"):
        read_characteristics([good, bad])


def frame_of(rows: dict[str, list], groups: list[str]) -> pd.DataFrame:
    return pd.DataFrame({**rows, "subset": groups})


def test_chi_square_equals_scipy_on_a_hand_table():
    # Manufacturer by subset:      released  holdout
    #   ACME                            3        1
    #   Beta                            1        2
    #   missing                         1        2
    groups = ["released"] * 5 + ["holdout"] * 5
    manufacturer = ["ACME", "ACME", "ACME", "Beta", np.nan, "ACME", "Beta", "Beta", np.nan, np.nan]
    frame = frame_of({"Manufacturer": manufacturer}, groups)
    hand = np.array([[1, 3], [2, 1], [2, 1]])  # columns in sorted group order: holdout, released
    table = counts(frame, "subset", "Manufacturer")
    assert list(table.index) == ["ACME", "Beta", MISSING] and list(table.columns) == ["holdout", "released"]
    assert np.array_equal(table.to_numpy(), hand)
    result = balance(frame, "subset", fields=["Manufacturer"]).iloc[0]
    expected = chi2_contingency(hand, correction=False)
    assert result["chi2"] == pytest.approx(expected.statistic)
    assert result["p_value"] == pytest.approx(expected.pvalue)
    assert (result["dof"], result["n"], result["categories"]) == (2, 10, 3)
    assert "expected counts < 5" in result["note"]


def test_a_2x2_table_is_not_continuity_corrected():
    groups = ["a"] * 10 + ["b"] * 10
    view = ["PA"] * 8 + ["AP"] * 2 + ["PA"] * 3 + ["AP"] * 7
    result = balance(frame_of({"ViewPosition": view}, groups), "subset", fields=["ViewPosition"]).iloc[0]
    hand = np.array([[2, 7], [8, 3]])  # AP, PA x a, b
    assert result["p_value"] == pytest.approx(chi2_contingency(hand, correction=False).pvalue)
    assert result["p_value"] != pytest.approx(chi2_contingency(hand, correction=True).pvalue)


def test_numbers_are_binned_on_pooled_quantiles():
    rng = np.random.default_rng(0)
    kvp = rng.choice([80.0, 90.0, 100.0, 110.0, 120.0, 125.0], size=60)
    kvp[:5] = np.nan
    groups = ["released"] * 30 + ["holdout"] * 30
    frame = frame_of({"KVP": kvp}, groups)
    table = counts(frame, "subset", "KVP", numeric_bins=3)
    bins = pd.qcut(pd.Series(kvp).dropna(), 3, duplicates="drop")
    assert list(table.index) == [str(b) for b in bins.cat.categories] + [MISSING]
    assert table.loc[MISSING].sum() == 5 and table.to_numpy().sum() == 60
    result = balance(frame, "subset", fields=["KVP"], numeric_bins=3).iloc[0]
    assert result["chi2"] == pytest.approx(chi2_contingency(table.to_numpy(), correction=False).statistic)
    assert "quantile bins" in result["note"]
    # Few distinct values are kept as they are.
    assert list(counts(frame, "subset", "KVP", numeric_bins=10).index) == ["80", "90", "100", "110", "120", "125",
                                                                           MISSING]  # fmt: skip


def test_untestable_fields_get_no_p_value_and_a_reason():
    frame = frame_of({"Manufacturer": ["ACME"] * 4, "KVP": [100.0, 110.0, 100.0, 110.0]}, ["a", "a", "b", "b"])
    one_group = frame.assign(subset="a")
    result = balance(frame, "subset", fields=["Manufacturer"]).iloc[0]
    assert np.isnan(result["p_value"]) and "categories" in result["note"]
    result = balance(one_group, "subset", fields=["KVP"]).iloc[0]
    assert np.isnan(result["p_value"]) and "groups" in result["note"]


def test_markdown_report_lists_every_field_and_its_counts():
    frame = frame_of({"Manufacturer": ["ACME", "Beta", "ACME", "Beta"], "ViewPosition": ["PA"] * 4},
                     ["a", "a", "b", "b"])  # fmt: skip
    fields = ["Manufacturer", "ViewPosition"]
    table = balance(frame, "subset", fields=fields)
    text = format_balance(table, {f: counts(frame, "subset", f) for f in fields})
    assert "### Manufacturer" in text and "### ViewPosition" in text
    assert "| ACME | 1 | 1 |" in text and "| total | 2 | 2 |" in text
    assert "n/a" in text  # ViewPosition has one category: no p-value
