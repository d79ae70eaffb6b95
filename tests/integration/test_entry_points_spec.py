"""Issue 37 §1: the entry points build one run spec. The same run asked for through
``dpfy.make_private``, through ``dpfy train``'s path (a ``TrainConfig`` resolved as ``dpfy train``
resolves it, then :func:`dpfy.train.private.make_private_run`, the one call into
``make_private`` a training makes) and through ``dpfy.hf.DPTrainer`` (its private loader, built
as its first training step builds it) gives the same ``optimizer.spec.to_dict()``.

Nothing trains: each entry point only builds its private optimizer, so the test takes seconds.
One tiny Hugging Face BERT classifier (built from a config here: nothing is downloaded) and one
dataset of token sequences serve all three, so the dataset size, batch and horizon are the same
by construction. The expected q and T are derived below from N, b and the epochs, not read from
dpfy.

One field may differ, and legitimately: under ``noise="bandmf"`` without ``bands``,
``dpfy train`` writes the default number of bands into its config before the run (so that
config.json states it; ``dpfy.train.config.resolve``), while ``make_private`` and ``DPTrainer``
leave the spec's ``noise.bands`` at None ("the default", :class:`dpfy.spec.run.BandMF`) and the
built sampler records the bands it used in ``sampling.resolved.bands``. The test checks that the
one difference is exactly that and that the bands are the same number. (``DPTrainer``'s epochs
are ``TrainingArguments.num_train_epochs``, a float: 2.0 where the others have 2, equal as
numbers, which is what ``==`` on the dicts compares.)
"""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: no downloads
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

import dpfy  # noqa: E402
from dpfy.data import DataSplits  # noqa: E402
from dpfy.hf import DPArguments, DPTrainer  # noqa: E402
from dpfy.train import TrainConfig  # noqa: E402
from dpfy.train.config import resolve  # noqa: E402
from dpfy.train.private import make_private_run  # noqa: E402

N, BATCH, EPOCHS, CLIP, EPSILON, DELTA, VOCAB = 64, 16, 2, 0.5, 2.0, 1e-5, 50


class _Sequences(Dataset):
    """N token sequences of length 6 with a label each, as a tokenizer pipeline yields them."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, VOCAB, (N, 6), generator=g)  # (N, 6)
        self.labels = torch.randint(0, 2, (N,), generator=g)  # (N,)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=8,
                                  max_position_embeddings=8)
    return transformers.BertForSequenceClassification(cfg)


def _through_make_private(data: Dataset, noise: str) -> dict:
    model = _bert()
    _, optimizer, _ = dpfy.make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.1), DataLoader(data, batch_size=BATCH),
        target_epsilon=EPSILON, target_delta=DELTA, epochs=EPOCHS, max_grad_norm=CLIP,
        accountant="rdp", noise=noise)
    return optimizer.spec.to_dict()


def _through_dpfy_train(data: Dataset, noise: str) -> dict:
    cfg, _ = resolve(TrainConfig(dataset="sequences", model="tiny_bert", epochs=EPOCHS,
                                 batch_size=BATCH, clip=CLIP, epsilon=EPSILON, delta=DELTA,
                                 accountant="rdp", noise=noise),
                     num_examples=N, reference_delta=None)
    splits = DataSplits("sequences", data, data, input_shape=(6,), num_classes=2,
                        description="synthetic token sequences")
    return make_private_run(cfg, _bert(), splits).optimizer.spec.to_dict()


def _through_dp_trainer(data: Dataset, noise: str, out) -> dict:
    args = transformers.TrainingArguments(output_dir=str(out), per_device_train_batch_size=BATCH,
                                          num_train_epochs=EPOCHS, use_cpu=True,
                                          report_to="none", save_strategy="no",
                                          disable_tqdm=True)
    with warnings.catch_warnings():  # DPTrainer's one-time note on the logged grad_norm
        warnings.simplefilter("ignore", UserWarning)
        trainer = DPTrainer(model=_bert(), args=args, train_dataset=data,
                            dp_args=DPArguments(target_epsilon=EPSILON, target_delta=DELTA,
                                                max_grad_norm=CLIP, accountant="rdp",
                                                extra={"noise": noise}))
    trainer.get_train_dataloader()  # builds the private model, optimizer and loader
    return trainer.dp_optimizer.spec.to_dict()


def _with_default_bands_resolved(spec: dict) -> dict:
    """``spec`` with a BandMF ``noise.bands`` of None ("the default") replaced by the bands the
    sampler resolved; the one legitimate difference (module docstring)."""
    if spec["noise"]["noise"] != "bandmf" or spec["noise"]["bands"] is not None:
        return spec
    return {**spec, "noise": {**spec["noise"], "bands": spec["sampling"]["resolved"]["bands"]}}


@pytest.mark.parametrize("noise", ["gaussian", "tree", "bandmf"])
def test_make_private_dpfy_train_and_dp_trainer_build_the_same_spec(noise, tmp_path):
    data = _Sequences()
    api = _through_make_private(data, noise)
    train = _through_dpfy_train(data, noise)
    hf = _through_dp_trainer(data, noise, tmp_path)

    # Derived here: T = epochs · ⌈N/b⌉ logical batches; Poisson rate q = b/N (the Gaussian's
    # and BandMF's cyclic Poisson within its bands; the tree's shuffled passes take one
    # participation per pass and state no rate below).
    assert api["accounting"]["max_steps"] == EPOCHS * math.ceil(N / BATCH) == 8
    if noise == "gaussian":
        assert api["sampling"]["resolved"]["sample_rate"] == BATCH / N
    assert api["noise"]["noise"] == noise and api["noise"]["noise_multiplier"] > 0  # calibrated
    assert api["accounting"]["target_epsilon"] == EPSILON and api["accounting"]["delta"] == DELTA

    if noise == "bandmf":  # dpfy train states the default bands, the others leave None
        assert api["noise"]["bands"] is None and hf["noise"]["bands"] is None
        assert train["noise"]["bands"] == train["sampling"]["resolved"]["bands"]
    assert _with_default_bands_resolved(api) == train
    assert api == hf
