"""Tests for slime.algo.off_policy (docs/algorithms.md#importance-weights-tis) and CISPO's loss against slime's own
functions.

The golden numbers marked "slime" are the outputs of slime's functions (github:THUDM/slime at 624b824:
`slime/utils/ppo_utils.py` compute_cispo_loss and compute_opsm_mask, `examples/train_infer_mismatch_helper/mis.py`
compute_mis_weights with use_rs=false, tis_batch_normalize=false, and its add_ppl_metrics) on the inputs below:
three samples of 3, 2 and 4 response tokens, the third sample's second token outside the loss mask.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from slime.algo.off_policy import mismatch_terms, opsm_mask, sample_means, tis_log_ratio, tis_weights
from slime.algo.policy_loss import cispo_loss
from slime.algo.reduction import reduce, token_weights

D = torch.float64
LENGTHS = [3, 2, 4]
LP = [-0.559, -0.547, -1.724, -1.313, -1.845, -1.679, -0.589, -1.121, -1.526]
OLD = [-0.548, -0.727, -1.441, -1.206, -1.597, -1.619, -0.543, -1.188, -1.297]
ROLL = [-0.608, 0.181, -1.477, -0.817, -2.037, -1.918, 0.252, -1.304, -2.266]
ADV = [0.8] * 3 + [-1.1] * 2 + [-0.4] * 4
MASK = [1, 1, 1, 1, 1, 1, 0, 1, 1]


def t(xs, **kw):
    return torch.tensor(xs, dtype=D, **kw)


# ---------------------------------------------------------------- CISPO against slime's compute_cispo_loss
@pytest.mark.parametrize(
    "eps_clip,eps_clip_high,slime_loss,slime_clipfrac",
    [
        (
            0.2,
            0.28,
            [
                0.442307756668345,
                0.5239023181021042,
                1.1033600000000001,
                -1.2977406294998983,
                -1.6236000000000002,
                -0.6324890607551814,
                -0.22500788629213236,
                -0.47947209241349076,
                -0.4883200000000001,
            ],
            [0, 0, 1, 0, 1, 0, 0, 0, 1],
        ),
        (  # the canonical one-sided setting of conf/algo/cispo.yaml: nothing clipped here
            1.0,
            4.0,
            [
                0.442307756668345,
                0.5239023181021042,
                1.0392544914161221,
                -1.2977406294998983,
                -1.5837405048827706,
                -0.6324890607551814,
                -0.22500788629213236,
                -0.47947209241349076,
                -0.48546853685150937,
            ],
            [0] * 9,
        ),
    ],
)
def test_cispo_equals_slime(eps_clip, eps_clip_high, slime_loss, slime_clipfrac):
    out = cispo_loss(t(LP), t(OLD), t(ADV), eps_clip=eps_clip, eps_clip_high=eps_clip_high)
    assert_close(out["loss"], t(slime_loss), rtol=0, atol=1e-12)
    assert_close(out["clipfrac"], t(slime_clipfrac), rtol=0, atol=0)


# ---------------------------------------------------------------- OPSM against slime's compute_opsm_mask
# per-sample mean of ℓ_old − ℓ over the masked tokens: [0.0380, 0.1775, 0.0740]; advantages [+, −, −]
@pytest.mark.parametrize(
    "delta,slime_mask",
    [(1e-4, [1, 1, 1, 0, 0, 0, 0, 0, 0]), (0.1, [1, 1, 1, 0, 0, 1, 1, 1, 1])],
)
def test_opsm_equals_slime(delta, slime_mask):
    lp = t(LP, requires_grad=True)
    out = opsm_mask(lp, t(OLD), t(ADV), t(MASK), LENGTHS, delta=delta)
    assert_close(out["keep"], t(slime_mask), rtol=0, atol=0)
    assert_close(out["masked"], 1 - t(slime_mask), rtol=0, atol=0)
    assert not out["keep"].requires_grad


def test_opsm_keeps_positive_advantages_and_an_undrifted_sample():
    drift = sample_means(t(OLD) - t(LP), t(MASK), LENGTHS)
    assert_close(drift, t([0.114 / 3, 0.355 / 2, 0.222 / 3]), rtol=0, atol=1e-12)
    # the same samples with every advantage positive: nothing is dropped at any threshold
    out = opsm_mask(t(LP), t(OLD), t(ADV).abs(), t(MASK), LENGTHS, delta=0.0)
    assert out["masked"].sum() == 0


def test_opsm_clipfrac_is_the_fraction_of_samples_dropped():
    """Reduced per sample (the default), the masked indicator is the share of the step's samples OPSM dropped
    (slime logs the per-micro-batch sum of each sample's masked-token share instead: 2.33 here)."""
    out = opsm_mask(t(LP), t(OLD), t(ADV), t(MASK), LENGTHS, delta=1e-4)
    weights = token_weights(t(MASK), LENGTHS, mode="per_sample", num_trajectories=3)
    assert_close(reduce(out["masked"], weights), t(2 / 3), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- TIS levels against slime's compute_mis_weights
# slime's weight × its rejection mask on each token (0 outside the loss mask); ours at truncate with low 0 is its
# truncate, with low > 0 its clip, and icepop its mask mode
SLIME_MIS = {
    ("token", "truncate", 0.0, 2.0): [
        1.0618365465453596,
        0.40333007806711874,
        1.0366558464909237,
        0.6777342700139711,
        1.552707218511336,
        1.3485096234729106,
        0.0,
        1.122995872133255,
        2.0,
    ],
    ("token", "truncate", 0.5, 2.0): [
        1.0618365465453596,
        0.5,
        1.0366558464909237,
        0.6777342700139711,
        1.552707218511336,
        1.3485096234729106,
        0.0,
        1.122995872133255,
        2.0,
    ],
    ("token", "icepop", 0.9, 1.1): [1.0618365465453596, 0.0, 1.0366558464909237, 0, 0, 0, 0, 0, 0],
    ("sequence", "truncate", 0.0, 2.0): [0.44396923921378006] * 3 + [1.0523228932832038] * 2 + [2.0, 0.0, 2.0, 2.0],
    ("sequence", "truncate", 0.5, 2.0): [0.5] * 3 + [1.0523228932832038] * 2 + [2.0, 0.0, 2.0, 2.0],
    ("sequence", "icepop", 0.5, 2.0): [0.0] * 3 + [1.0523228932832038] * 2 + [0.0] * 4,
    ("geometric", "truncate", 0.0, 2.0): [0.7628707442761581] * 3
    + [1.0258279062704445] * 2
    + [1.5861874923329213, 0.0, 1.5861874923329213, 1.5861874923329213],
    ("geometric", "icepop", 0.5, 2.0): [0.7628707442761581] * 3
    + [1.0258279062704445] * 2
    + [1.5861874923329213, 0.0, 1.5861874923329213, 1.5861874923329213],
    ("geometric", "icepop", 0.9, 1.1): [0.0] * 3 + [1.0258279062704445] * 2 + [0.0] * 4,
}


@pytest.mark.parametrize("level,mode,low,high", list(SLIME_MIS), ids=lambda v: str(v))
def test_tis_levels_equal_slime(level, mode, low, high):
    mask = t(MASK)
    out = tis_weights(
        t(OLD), t(ROLL), clip_low=low, clip_high=high, mode=mode, level=level, loss_mask=mask, response_lengths=LENGTHS
    )
    assert_close(out["weights"] * mask, t(SLIME_MIS[level, mode, low, high]), rtol=0, atol=1e-12)
    assert_close(out["clipfrac"], (out["weights"] != out["ratio"]).to(D), rtol=0, atol=0)


def test_sequence_ratio_is_the_product_and_geometric_its_mean():
    diff = t(OLD) - t(ROLL)
    seq = tis_log_ratio(t(OLD), t(ROLL), t(MASK), LENGTHS, "sequence")
    geo = tis_log_ratio(t(OLD), t(ROLL), t(MASK), LENGTHS, "geometric")
    third = float(diff[5] + diff[7] + diff[8])  # token 6 is outside the loss mask
    assert_close(seq[5:], t([third] * 4), rtol=0, atol=1e-12)
    assert_close(geo[5:], t([third / 3] * 4), rtol=0, atol=1e-12)
    assert_close(tis_log_ratio(t(OLD), t(ROLL), t(MASK), LENGTHS, "token"), diff, rtol=0, atol=0)


def test_a_huge_sequence_ratio_is_bounded_before_exp():
    out = tis_weights(t([30.0, 30.0]), t([0.0, 0.0]), clip_low=0.0, clip_high=2.0, level="sequence")
    assert_close(out["ratio"], t([math.exp(20.0)] * 2), rtol=1e-12, atol=0)
    assert_close(out["weights"], t([2.0, 2.0]), rtol=0, atol=0)


def test_tis_unknown_level():
    with pytest.raises(ValueError, match="unknown TIS level 'seq'; valid: token, sequence, geometric"):
        tis_weights(t([0.0]), t([0.0]), clip_low=0.0, clip_high=2.0, level="seq")


# ---------------------------------------------------------------- mismatch metrics against slime's add_ppl_metrics
def test_mismatch_terms_reduced_per_sample_equal_slime():
    """slime's metrics, each averaged per sample then over the samples (its sum_of_sample_mean)."""
    weights = token_weights(t(MASK), LENGTHS, mode="per_sample", num_trajectories=3)
    got = {k: float(reduce(v, weights)) for k, v in mismatch_terms(t(OLD), t(ROLL)).items()}
    slime = {
        "training_log_ppl": (0.9053333333333334 + 1.4015 + 1.368) / 3,
        "rollout_log_ppl": (0.6346666666666667 + 1.427 + 1.8293333333333333) / 3,
        "mismatch_kl": ((-0.06 + 0.908 - 0.036) / 3 + (0.389 - 0.44) / 2 + (-0.299 - 0.116 - 0.969) / 3) / 3,
        "mismatch_k3_kl": (
            (0.0018365465453595853 + 0.31133007806711865 + 0.0006558464909236505) / 3
            + (0.06673427001397103 + 0.11270721851133603) / 2
            + (0.04950962347291066 + 0.00699587213325481 + 0.6663078334274808) / 3
        )
        / 3,
    }
    for key, value in slime.items():
        assert got[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key
    abs_diff = ((0.06 + 0.908 + 0.036) / 3 + (0.389 + 0.44) / 2 + (0.299 + 0.116 + 0.969) / 3) / 3
    assert got["train_rollout_logprob_abs_diff"] == pytest.approx(abs_diff, rel=1e-12)


# ---------------------------------------------------------------- TIS
def test_tis_truncate_reference():
    # diffs [0.2, 1.0, -3.0, 0.0]; ratio = exp(diff); clamp to [0.1, 2.0]
    old = t([0.2, 1.0, -3.0, 0.0], requires_grad=True)
    out = tis_weights(old, torch.zeros(4, dtype=D), clip_low=0.1, clip_high=2.0)
    ratio = [math.exp(0.2), math.e, math.exp(-3.0), 1.0]
    assert_close(out["ratio"], t(ratio), rtol=0, atol=1e-14)
    assert_close(out["weights"], t([math.exp(0.2), 2.0, 0.1, 1.0]), rtol=0, atol=1e-14)
    assert_close(out["weights"][0], t(1.2214028), rtol=0, atol=1e-7)
    assert_close(out["clipfrac"], t([0.0, 1.0, 1.0, 0.0]), rtol=0, atol=0)
    assert_close(out["abs"], t([abs(r - 1) for r in ratio]), rtol=0, atol=1e-14)
    assert_close(out["abs"][1], t(1.7183), rtol=0, atol=1e-4)
    assert all(not v.requires_grad for v in out.values())


def test_tis_icepop_zeroes_outside():
    out = tis_weights(t([0.2, 1.0, -3.0, 0.0]), torch.zeros(4, dtype=D), clip_low=0.1, clip_high=2.0, mode="icepop")
    assert_close(out["weights"], t([math.exp(0.2), 0.0, 0.0, 1.0]), rtol=0, atol=1e-14)
    assert_close(out["clipfrac"], t([0.0, 1.0, 1.0, 0.0]), rtol=0, atol=0)


def test_tis_unknown_mode():
    with pytest.raises(ValueError):
        tis_weights(t([0.0]), t([0.0]), clip_low=0.0, clip_high=2.0, mode="mis")
