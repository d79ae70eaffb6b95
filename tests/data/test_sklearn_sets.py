"""scikit-learn's bundled sets: sizes from the dataset descriptions, public scaling bounds."""

import re

import sklearn.datasets
import torch

from dpfy.data import load_dataset
from dpfy.data.sklearn_sets import BREAST_CANCER_RANGES


def test_digits_split_and_scale():
    d = load_dataset("digits")
    # sklearn DESCR: 1,797 instances, 8x8, 10 classes; 20% held out = round(359.4) = 359
    assert (len(d.train), len(d.test)) == (1797 - 359, 359)
    x = d.train.tensors[0]
    assert x.shape[1:] == (1, 8, 8) and d.num_classes == 10
    assert float(x.min()) == 0.0 and float(x.max()) == 1.0        # pixel counts 0..16 / 16


def test_breast_cancer_split_and_scale():
    d = load_dataset("breast_cancer")
    # DESCR: 569 instances, 30 attributes, 2 classes; 20% held out = round(113.8) = 114
    assert (len(d.train), len(d.test)) == (569 - 114, 114)
    x = d.train.tensors[0]
    assert x.shape[1:] == (30,) and d.num_classes == 2
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0


def test_split_is_disjoint_and_complete():
    d = load_dataset("digits")
    rows = torch.cat([d.train.tensors[0], d.test.tensors[0]]).flatten(1)
    assert len(rows) == 1797
    full = torch.as_tensor(sklearn.datasets.load_digits().images / 16.0, dtype=torch.float32)
    assert torch.equal(rows.sum(0), full.flatten(1).sum(0))       # same multiset of pixels


def test_breast_cancer_bounds_are_the_published_table():
    # Independent source: the Min/Max table printed in sklearn's DESCR.
    descr = sklearn.datasets.load_breast_cancer().DESCR
    rows = re.findall(r"^[a-z ()]+:\s+([\d.]+)\s+([\d.]+)\s*$", descr, flags=re.M)
    assert [(float(a), float(b)) for a, b in rows] == list(BREAST_CANCER_RANGES)
