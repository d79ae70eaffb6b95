"""Fashion-MNIST loader: the real Debian files (when installed) and synthetic IDX directories."""

import gzip
import shutil

import numpy as np
import pytest
import torch

from dpfy.data import load_dataset
from dpfy.data.fashion_mnist import DEFAULT_DIR, MEAN, STD
from fake_idx import FILES, encode_idx, write_fake

REAL = (DEFAULT_DIR / "train-images-idx3-ubyte.gz").is_file()


@pytest.mark.skipif(not REAL, reason="dataset-fashion-mnist not installed")
def test_real_files_match_the_dataset_paper():
    # Xiao et al. 2017: 60,000 train and 10,000 test 28x28 images, 10 balanced classes
    # (7,000 per class: 6,000 train + 1,000 test).
    d = load_dataset("fashion_mnist")
    x, y = d.train.tensors
    assert x.shape == (60000, 1, 28, 28) and d.input_shape == (1, 28, 28)
    assert torch.bincount(y).tolist() == [6000] * 10
    assert torch.bincount(d.test.tensors[1]).tolist() == [1000] * 10
    # The standardization constants are public; on the real data they give mean≈0, std≈1.
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1) < 0.01
    assert d.reference_delta == 1e-5


@pytest.mark.parametrize("gz", [True, False])
def test_synthetic_directory_and_normalization(tmp_path, gz):
    write_fake(tmp_path, gz=gz)
    d = load_dataset("fashion_mnist", data_dir=tmp_path)
    x, y = d.train.tensors
    assert x.shape == (6, 1, 28, 28) and y.tolist() == [0, 1, 2, 3, 4, 5]
    # image 3 has pixels 30 -> (30/255 - MEAN) / STD
    assert torch.allclose(x[3], torch.full((1, 28, 28), (30 / 255 - MEAN) / STD))
    assert len(d.test) == 4


def test_missing_directory_says_how_to_install(tmp_path):
    with pytest.raises(ValueError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", data_dir=tmp_path / "nope")


def test_directory_without_files_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz.*apt-get install"):
        load_dataset("fashion_mnist", data_dir=tmp_path)


def test_truncated_file_says_reinstall(tmp_path):
    write_fake(tmp_path)
    p = tmp_path / "train-labels-idx1-ubyte.gz"
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes())[:-2]))
    with pytest.raises(ValueError, match="truncated or corrupt.*--reinstall"):
        load_dataset("fashion_mnist", data_dir=tmp_path)


def test_mismatched_counts_are_refused(tmp_path):
    write_fake(tmp_path)
    shutil.copy(tmp_path / "t10k-labels-idx1-ubyte.gz", tmp_path / "train-labels-idx1-ubyte.gz")
    with pytest.raises(ValueError, match="N labels"):
        load_dataset("fashion_mnist", data_dir=tmp_path)


def test_unknown_dataset_lists_names():
    with pytest.raises(ValueError, match=r"dataset must be one of \['breast_cancer', 'digits', "
                                         r"'fashion_mnist', 'fashion_mnist_scattering'\], "
                                         r"got dataset = 'cifar10'"):
        load_dataset("cifar10")


def test_data_dir_for_bundled_dataset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="Drop --data-dir"):
        load_dataset("digits", data_dir=tmp_path)



def test_scattering_cache_is_keyed_by_the_images_not_only_their_count(tmp_path, monkeypatch,
                                                                     capsys):
    # Before: the cache file was named by J, L and the split alone, so a second --data-dir with
    # as many images got the first directory's features (only the count was checked).
    monkeypatch.setenv("DPFY_CACHE_DIR", str(tmp_path / "cache"))
    write_fake(tmp_path / "a", n_train=3, n_test=2)
    write_fake(tmp_path / "b", n_train=3, n_test=2)
    shifted = np.stack([np.full((28, 28), 10 * k + 5, np.uint8) for k in range(3)])
    (tmp_path / "b" / (FILES["train_images"] + ".gz")).write_bytes(
        gzip.compress(encode_idx(shifted)))
    first = load_dataset("fashion_mnist_scattering", data_dir=tmp_path / "a")
    second = load_dataset("fashion_mnist_scattering", data_dir=tmp_path / "b")
    assert not torch.equal(first.train.tensors[0], second.train.tensors[0])
    assert torch.equal(first.test.tensors[0], second.test.tensors[0])  # same test images
    # the long first computation says so (a silent ten-minute pause looks like a hang); the
    # cached test features of the second load are read without a word
    said = capsys.readouterr().err
    assert said.count("computing the scattering features") == 3  # a's 2 splits, b's train
