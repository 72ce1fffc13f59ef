"""Head-to-tail grouping."""

import numpy as np
import pytest

from evaluation.groups import class_groups, frequency_group, group_means


@pytest.mark.parametrize(
    ("name", "prevalence", "group"),
    [("Normal", 0.001, "normal"), ("No Finding", 0.5, "normal"), ("Nodule", 0.1001, "common"),
     ("Nodule", 0.10, "medium"), ("Nodule", 0.0101, "medium"), ("Nodule", 0.01, "rare"),
     ("Nodule", 0.001, "rare"), ("Nodule", 0.00099, "very_rare"), ("Nodule", 0.0, "very_rare")],
)  # fmt: skip
def test_boundaries(name, prevalence, group):
    assert frequency_group(name, prevalence) == group


def test_class_groups_and_means_skip_undefined():
    labels = ["Normal", "A", "B", "C", "D"]
    groups = class_groups(labels, np.array([400, 300, 50, 5, 0]), n_train=1000)
    assert groups == {"normal": [0], "common": [1], "medium": [2], "rare": [3], "very_rare": [4]}
    means = group_means(np.array([0.9, 0.8, 0.5, 0.2, np.nan]), groups)
    assert means == {"normal": 0.9, "common": 0.8, "medium": 0.5, "rare": 0.2}
