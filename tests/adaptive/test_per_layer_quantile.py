"""``per_layer_quantile`` lives in ``adaptive/quantile.py``; its tests are in ``test_quantile.py``
(the ``FILE_ALIASES`` decision: two keys may share a file when the table says so). This file
keeps the one-method-one-file-one-test-file rule
visible and checks the alias."""

from dpfy.adaptive import FILE_ALIASES, REGISTRY, LayerQuantileClipping


def test_registered_under_its_key_in_the_quantile_file():
    assert REGISTRY["per_layer_quantile"] is LayerQuantileClipping
    assert FILE_ALIASES["per_layer_quantile"] == "quantile"
