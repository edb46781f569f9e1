"""The estimator registry: each record's attributes, its functions' numbers on a 2×3 toy batch (two prompts ×
three samples for rewards, two samples × three tokens for advantages), and "adding an estimator is the test": a new
one (vanilla REINFORCE, test-only) is one record plus its functions, registered through the API, and every path
then uses it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from slime.algo.estimator_functions import AdvantageInputs, PolicyLossInputs
from slime.algo.estimators import ESTIMATORS, FUNCTIONS, Estimator, load_function
from slime.config.schema import AlgoConfig
from slime.plan.listing import listing
from slime.plan.validate import collect_problems
from slime.rollout.postprocess import post_process_rewards
from slime.train.actor_loss import actor_loss
from slime.train.token_advantages import compute_advantages
from slime.train.train_setup import needs_old_log_probs
from tests.helpers.compose import CONF, ROOT, typed_config

F64 = dict(dtype=torch.float64)
BUILT_IN = ["cispo", "grpo", "gspo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "rloo", "sft"]


def t(*values):
    return torch.tensor(values, **F64)


def algo(estimator: str, **kw) -> AlgoConfig:
    return AlgoConfig(name=estimator, advantage_estimator=estimator, **kw)


# --- the built-in records ---

# name: (needs_critic, needs_old_log_probs, reward_kl, needs_whitening, uses_advantages, generates,
#        min_samples_per_prompt, rollout_function)
ATTRIBUTES = {
    "grpo": (False, False, False, False, True, True, 1, "default"),
    "gspo": (False, True, False, False, True, True, 1, "default"),
    "cispo": (False, False, False, False, True, True, 1, "default"),
    "rloo": (False, False, False, False, True, True, 2, "default"),
    "reinforce_plus_plus": (False, False, True, True, True, True, 1, "default"),
    "reinforce_plus_plus_baseline": (False, False, True, True, True, True, 1, "default"),
    "ppo": (True, True, True, False, True, True, 1, "default"),
    "sft": (False, False, False, False, False, False, 1, "sft"),
}


def test_the_registry_holds_every_built_in_estimator_and_every_algo_option_names_one():
    assert ESTIMATORS.names() == BUILT_IN
    chosen = {yaml.safe_load(p.read_text())["advantage_estimator"] for p in (CONF / "algo").glob("*.yaml")}
    assert chosen <= set(BUILT_IN) and chosen >= {"grpo", "ppo", "sft"}


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_record_pins_what_differs(name):
    r = ESTIMATORS.get(name)
    assert r.name == name
    got = (
        r.needs_critic,
        r.needs_old_log_probs,
        r.reward_kl,
        r.needs_whitening,
        r.uses_advantages,
        r.generates,
        r.min_samples_per_prompt,
        r.rollout_function,
    )
    assert got == ATTRIBUTES[name]


def test_only_ppo_trains_a_critic_and_only_sft_reads_its_responses_from_data():
    assert ESTIMATORS.names(where=lambda e: e.needs_critic) == ["ppo"]
    assert ESTIMATORS.names(where=lambda e: not e.generates) == ["sft"]
    assert ESTIMATORS.names(where=lambda e: e.reward_kl) == [
        "ppo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
    ]


def test_records_are_frozen_and_keyword_only():
    with pytest.raises(AttributeError):
        ESTIMATORS.get("grpo").needs_critic = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        Estimator("x", "a.b", "a.c", "a.d")  # type: ignore[misc]


@pytest.mark.parametrize("name", BUILT_IN)
def test_each_records_functions_resolve(name):
    assert all(callable(load_function(path)) for path in ESTIMATORS.get(name).function_paths())


def test_reading_the_registry_imports_no_torch():
    """Validation, the dry run and the driver read records without torch; the functions import it on first use."""
    code = (
        "import sys\n"
        "from slime.algo.estimators import ESTIMATORS\n"
        "assert ESTIMATORS.get('ppo').needs_critic\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "False"


def test_an_unknown_name_lists_the_registered_ones_and_the_closest():
    with pytest.raises(ValueError) as info:
        ESTIMATORS.get("grop")
    assert "'grop' (did you mean grpo" in str(info.value)
    assert f"registered: {', '.join(BUILT_IN)}" in str(info.value)
    assert ESTIMATORS.find("grop") is None and "grop" not in ESTIMATORS
    problems = {p.key: str(p) for p in collect_problems(typed_config(["algo.advantage_estimator=rlooo"]))}
    assert "did you mean rloo" in problems["algo.advantage_estimator"]


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="already registered"):
        ESTIMATORS.register(ESTIMATORS.get("grpo"))


# --- golden numbers: reward transforms on two prompts × three samples ---

RAW = t(1, 0, 0, 1, 1, 0)
CENTRED = t(2 / 3, -1 / 3, -1 / 3, 1 / 3, 1 / 3, -2 / 3)  # group means 1/3 and 2/3
STD = (1 / 3) ** 0.5  # both groups: Bessel std of {1, 0, 0} and {1, 1, 0}


@pytest.mark.parametrize(
    "name,expected",
    [
        ("grpo", CENTRED / (STD + 1e-6)),
        ("gspo", CENTRED / (STD + 1e-6)),
        ("reinforce_plus_plus_baseline", CENTRED),
        ("rloo", t(1, -0.5, -0.5, 0.5, 0.5, -1)),  # r_i minus the mean of the other two
        ("reinforce_plus_plus", RAW),
        ("ppo", RAW),
        ("sft", RAW),
    ],
)
def test_reward_transforms_on_a_2x3_batch(name, expected):
    got = ESTIMATORS.get(name).transform_rewards(RAW, 3, algo(name))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(post_process_rewards(RAW, algo(name), 3), expected, rtol=1e-12, atol=1e-12)


def test_dr_grpo_keeps_the_mean_only():
    got = ESTIMATORS.get("grpo").transform_rewards(RAW, 3, algo("grpo", disable_grpo_std_normalization=True))
    torch.testing.assert_close(got, CENTRED, rtol=1e-12, atol=1e-12)


# --- golden numbers: token advantages on two samples × three tokens ---
# rewards [1, −1]; kl [0.1, 0, 0.2 | 0, 0.1, 0], kl_coef 0.5: ρ = −0.5·kl plus r at the last token
# = [−0.05, 0, 0.9 | 0, −0.05, −1]; values [0.5, 0.5, 0.5 | 0, 0, 0]; γ = 1, λ = 0.5.
TOKENS = AdvantageInputs(
    rewards=t(1, -1),
    kl=t(0.1, 0, 0.2, 0, 0.1, 0),
    loss_mask=torch.ones(6, **F64),
    response_lengths=[3, 3],
    values=t(0.5, 0.5, 0.5, 0, 0, 0),
)
KNOBS = algo("ppo", kl_coef=0.5, gamma=1.0, lambd=0.5)


@pytest.mark.parametrize(
    "name,advantages,returns",
    [
        ("grpo", t(1, 1, 1, -1, -1, -1), None),
        ("rloo", t(1, 1, 1, -1, -1, -1), None),
        # G_t = Σ_{k≥t} ρ_k: [0.85, 0.9, 0.9 | −1.05, −1.05, −1]
        ("reinforce_plus_plus", t(0.85, 0.9, 0.9, -1.05, -1.05, -1), t(0.85, 0.9, 0.9, -1.05, -1.05, -1)),
        # r̃ − 0.5·kl
        ("reinforce_plus_plus_baseline", t(0.95, 1, 0.9, -1, -1.05, -1), None),
        # δ = ρ + V_{t+1} − V_t = [−0.05, 0, 0.4 | 0, −0.05, −1]; A_t = δ_t + 0.5·A_{t+1}; R = A + V
        ("ppo", t(0.05, 0.2, 0.4, -0.275, -0.55, -1), t(0.55, 0.7, 0.9, -0.275, -0.55, -1)),
        ("sft", t(0, 0, 0, 0, 0, 0), None),
    ],
)
def test_token_advantages_on_a_2x3_batch(name, advantages, returns):
    got, got_returns = ESTIMATORS.get(name).advantages(TOKENS, KNOBS)
    torch.testing.assert_close(got, advantages, rtol=1e-12, atol=1e-12)
    if returns is None:
        assert got_returns is None
    else:
        torch.testing.assert_close(got_returns, returns, rtol=1e-12, atol=1e-12)


def test_ppo_without_values_names_the_critic():
    no_values = AdvantageInputs(rewards=t(1), kl=t(0), loss_mask=t(1), response_lengths=[1])
    with pytest.raises(ValueError, match="critic"):
        ESTIMATORS.get("ppo").advantages(no_values, KNOBS)


# --- golden numbers: policy losses on two tokens ---
# ℓ = [−1, −2], ℓ_old = [−1.2, −1.9]: ρ = [e^0.2, e^−0.1] = [1.2214, 0.9048]; A = [1, −1]; ε = 0.2
LOSS_INPUTS = PolicyLossInputs(
    log_probs=t(-1.0, -2.0),
    old_log_probs=t(-1.2, -1.9),
    advantages=t(1.0, -1.0),
    loss_mask=t(1.0, 1.0),
    response_lengths=[2],
)


def test_policy_losses_on_two_tokens():
    ratio = torch.exp(t(0.2, -0.1))
    clipped = ESTIMATORS.get("grpo").loss(LOSS_INPUTS, algo("grpo"))
    # token 0: max(−1.2214, −clip(1.2214)=−1.2) = −1.2 (clipped); token 1: max(0.9048, 0.9048)
    torch.testing.assert_close(clipped["loss"], t(-1.2, float(ratio[1])))
    torch.testing.assert_close(clipped["clipfrac"], t(1.0, 0.0))
    # gspo: one sequence ratio exp(mean(0.2, −0.1)) = e^0.05 for both tokens, inside the clip range
    seq = ESTIMATORS.get("gspo").loss(LOSS_INPUTS, algo("gspo"))
    s = torch.exp(torch.tensor(0.05, **F64))
    torch.testing.assert_close(seq["loss"], t(-float(s), float(s)))
    # sft: −ℓ per token and no clip metrics
    nll = ESTIMATORS.get("sft").loss(LOSS_INPUTS, algo("sft"))
    assert list(nll) == ["loss"] and torch.equal(nll["loss"], t(1.0, 2.0))


def advantages_of_two_samples(a: AlgoConfig):
    """(advantages, returns) of rewards [1, −1] on two samples of three tokens."""
    advantages, returns, _ = compute_advantages(
        a,
        rewards=t(1, -1),
        response_lengths=[3, 3],
        loss_mask=torch.ones(6, **F64),
        old_log_probs=None,
        ref_log_probs=None,
        values=None,
        all_reduce=None,
    )
    return advantages, returns


def loss_of_two_tokens(a: AlgoConfig, log_probs):
    """The actor loss (the mean over the two tokens) and its metrics: ℓ_old = [−1.2, −1.9], A = [1, −1]."""
    half = t(0.5, 0.5)
    return actor_loss(
        log_probs=log_probs,
        old_log_probs=t(-1.2, -1.9),
        advantages=t(1.0, -1.0),
        weights=half,
        pg_weights=half,
        algo=a,
        loss_mask=t(1.0, 1.0),
        response_lengths=[2],
    )


def test_cispo_rewards_and_advantages_are_grpos_and_its_loss_keeps_clipped_gradients():
    a = algo("cispo", eps_clip=0.2)
    torch.testing.assert_close(post_process_rewards(RAW, a, 3), CENTRED / (STD + 1e-6), rtol=1e-12, atol=1e-12)
    advantages, returns = advantages_of_two_samples(a)
    torch.testing.assert_close(advantages, t(1, 1, 1, -1, -1, -1))
    assert returns is None
    # with one optimizer step per rollout ℓ_old = sg(ℓ): ρ = 1 and the loss is −A·ℓ, no forward pass for ℓ_old
    assert not needs_old_log_probs(a, num_steps_per_rollout=1)
    log_probs = t(-1.0, -2.0).requires_grad_()
    loss, metrics = loss_of_two_tokens(a, log_probs)
    # L_t = −sg(clip(ρ_t, 0.8, 1.2))·A_t·ℓ_t: token 0: −1.2·1·(−1) = 1.2; token 1: −0.9048·(−1)·(−2) = −1.8097
    r1 = float(torch.exp(torch.tensor(-0.1, **F64)))
    torch.testing.assert_close(loss, torch.tensor(0.5 * (1.2 - 2 * r1), **F64))
    torch.testing.assert_close(metrics["pg_clipfrac"], torch.tensor(0.5, **F64))  # token 0's ratio was clipped
    loss.backward()
    # ∂L/∂ℓ = −0.5·clip(ρ)·A: the clipped token keeps its gradient (PPO's clip would zero it)
    torch.testing.assert_close(log_probs.grad, t(-0.5 * 1.2, 0.5 * r1))


# --- adding an estimator is the test ---


REINFORCE = Estimator(
    name="reinforce",
    reward_transform=f"{FUNCTIONS}.group_centred_rewards",
    token_advantages=f"{FUNCTIONS}.broadcast_advantages",
    policy_loss="tests.helpers.reinforce_estimator.reinforce_policy_loss",
)


@pytest.fixture
def reinforce():
    """REINFORCE registered for one test, and unregistered after it whatever happens."""
    assert "reinforce" not in ESTIMATORS
    ESTIMATORS.register(REINFORCE)
    try:
        yield REINFORCE
    finally:
        ESTIMATORS.unregister("reinforce")


def test_validation_refuses_a_new_estimator_until_it_is_registered_and_accepts_it_then(reinforce):
    ESTIMATORS.unregister("reinforce")
    refused = {p.key for p in collect_problems(typed_config(["algo.advantage_estimator=reinforce"]))}
    ESTIMATORS.register(REINFORCE)
    accepted = {p.key for p in collect_problems(typed_config(["algo.advantage_estimator=reinforce"]))}
    assert "algo.advantage_estimator" in refused and "algo.advantage_estimator" not in accepted
    assert accepted == {p.key for p in collect_problems(typed_config([]))}  # as clean as the default grpo run
    assert "algo.advantage_estimator   cispo, grpo, gspo, ppo, reinforce, reinforce_plus_plus" in listing()


def test_a_new_estimators_rewards_advantages_and_loss_come_from_its_record(reinforce):
    a = algo("reinforce")
    torch.testing.assert_close(post_process_rewards(RAW, a, 3), CENTRED, rtol=1e-12, atol=1e-12)
    advantages, returns = advantages_of_two_samples(a)
    torch.testing.assert_close(advantages, t(1, 1, 1, -1, -1, -1))
    assert returns is None and not needs_old_log_probs(a, num_steps_per_rollout=1)
    log_probs = t(-1.0, -2.0).requires_grad_()
    loss, metrics = loss_of_two_tokens(a, log_probs)
    torch.testing.assert_close(loss, torch.tensor(0.5 * (1.0 - 2.0), **F64))  # −A·ℓ: [1, −2]
    assert "pg_clipfrac" not in metrics  # its loss returns no clip metrics
    loss.backward()
    torch.testing.assert_close(log_probs.grad, t(-0.5, 0.5))


def test_removing_an_estimator_restores_the_listing():
    before, names = listing(), ESTIMATORS.names()
    ESTIMATORS.register(REINFORCE)
    try:
        assert listing() != before and "reinforce" in ESTIMATORS
    finally:
        assert ESTIMATORS.unregister("reinforce") == REINFORCE
    assert listing() == before and ESTIMATORS.names() == names
    with pytest.raises(ValueError, match="unknown advantage estimator 'reinforce'"):
        ESTIMATORS.get("reinforce")


def test_no_site_compares_the_estimator_name_with_a_literal():
    """No code chooses by comparing the name: every choice goes through the record."""
    root = Path(__file__).resolve().parents[2] / "slime"
    pattern = re.compile(r"advantage_estimator\s*(==|!=|not in|in)\s*[\"'(\[]")
    hits = [
        f"{p.relative_to(root)}:{n}"
        for p in root.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


def test_validation_reads_what_a_new_record_needs():
    needy = Estimator(
        name="needy",
        reward_transform=f"{FUNCTIONS}.raw_rewards",
        token_advantages=f"{FUNCTIONS}.broadcast_advantages",
        policy_loss=f"{FUNCTIONS}.clipped_surrogate_loss",
        needs_whitening=True,
        min_samples_per_prompt=64,
    )
    overrides = ["algo.advantage_estimator=needy", "algo.normalize_advantages=false"]
    ESTIMATORS.register(needy)
    try:
        found = {p.key: str(p) for p in collect_problems(typed_config(overrides))}
    finally:
        ESTIMATORS.unregister("needy")
    assert "needy requires advantage whitening" in found["algo.normalize_advantages"]
    assert "at least 64 samples per prompt" in found["rollout.n_samples_per_prompt"]
    assert "algo.normalize_advantages" not in {p.key for p in collect_problems(typed_config(overrides[1:]))}
