"""A data-parallel run says its global batch and q before training: Opacus's DPDDP reads
``batch_size`` as global, dpfy (like DDP) per rank, so a port would double q unseen."""

from dpfy.step.distributed import global_batch_notice


def test_the_notice_states_the_global_batch_q_and_the_fix():
    # Opacus's DDP tutorial shape: N = 60000, 2 ranks. A per-rank batch of 3000 is a global
    # expected batch of 6000: q = 6000 / 60000 = 0.1 (Opacus would read 3000 as global: 0.05).
    text = global_batch_notice(2, 3000, 60000, 0.1)
    assert "2 × 3000 = 6000 of 60000 examples, q = 0.1" in text
    assert "per rank" in text and "batch_size = B / 2" in text
