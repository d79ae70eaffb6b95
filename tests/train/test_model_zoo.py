"""The model zoo: architectures by name, sizes derived by hand."""

import pytest
import torch

from dpfy.models import MODELS, build_model


def test_tanh_cnn_is_tramer_boneh_26k():
    m = build_model("tanh_cnn", input_shape=(1, 28, 28), num_classes=10)
    # conv 16·1·8·8+16, conv 32·16·4·4+32, linear 512·32+32, linear 32·10+10;
    # Tramèr & Boneh 2021 call it the "26k parameters" CNN
    expected = (16 * 64 + 16) + (32 * 16 * 16 + 32) + (512 * 32 + 32) + (32 * 10 + 10)
    assert sum(p.numel() for p in m.parameters()) == expected == 26010
    # 28 -(conv 8, s2, p3)-> 14 -(pool 2, s1)-> 13 -(conv 4, s2)-> 5 -(pool 2, s1)-> 4: 32·4·4
    assert m[7].in_features == 512
    assert sum(isinstance(l, torch.nn.Tanh) for l in m) == 3
    assert m(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_runs_on_fashion_mnist_shape(name):
    m = build_model(name, input_shape=(1, 28, 28), num_classes=10)
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    has_bn = any(isinstance(l, torch.nn.modules.batchnorm._BatchNorm) for l in m.modules())
    assert has_bn == (name == "batchnorm_cnn")  # the one model for --batchnorm public|privatized


def test_logreg_and_mlp_on_vectors():
    for name in ("logreg", "mlp"):
        model = build_model(name, input_shape=(30,), num_classes=2)
        assert model(torch.zeros(4, 30)).shape == (4, 2)


def test_image_model_on_vectors_says_what_to_use():
    with pytest.raises(ValueError, match="Use --model mlp or --model logreg"):
        build_model("tanh_cnn", input_shape=(30,), num_classes=2)


def test_unknown_model_lists_names():
    names = r"\['batchnorm_cnn', 'groupnorm_cnn', 'logreg', 'mlp', 'scatter_linear', 'tanh_cnn'\]"
    with pytest.raises(ValueError, match=rf"model must be one of {names}, got model = 'resnet'"):
        build_model("resnet", input_shape=(1, 28, 28), num_classes=10)
