"""Secrets never reach a sink: config keys, CLI overrides and secret environment values are redacted."""

from slime.tracking.secrets import REDACTED, redact, redact_overrides, secret_env_values

ENV = {"WANDB_API_KEY": "0123456789abcdef", "HF_TOKEN": "hf_secretvalue", "PATH": "/usr/bin", "MY_KEY": "short"}


def test_config_keys_and_env_values_are_redacted_data_fields_kept():
    secrets = secret_env_values(ENV)
    assert secrets == ["0123456789abcdef", "hf_secretvalue"]
    config = {
        "rollout": {
            "router": {"extra_args": {"api_key": "sk-live-123", "cache_threshold": 0.3}},
            "stop_token_ids": [2],
        },
        "data": {"input_key": "prompt", "label_key": "label"},
        "parallelism": {"max_tokens_per_gpu": 8192},
        "logger": {"wandb": {"notes": "token is hf_secretvalue here", "password": None}},
    }
    out = redact(config, secrets)
    assert out["rollout"]["router"]["extra_args"] == {"api_key": REDACTED, "cache_threshold": 0.3}
    assert out["rollout"]["stop_token_ids"] == [2]
    assert out["data"] == {"input_key": "prompt", "label_key": "label"}
    assert out["parallelism"]["max_tokens_per_gpu"] == 8192
    assert out["logger"]["wandb"] == {"notes": f"token is {REDACTED} here", "password": None}
    assert "sk-live" not in repr(out) and "hf_secret" not in repr(out)


def test_overrides_are_redacted():
    secrets = secret_env_values(ENV)
    overrides = [
        "algo.eps_clip=0.1",
        "+rollout.sglang.api_key=abc",
        "parallelism.max_tokens_per_gpu=4096",
        "x=0123456789abcdef",
    ]
    assert redact_overrides(overrides, secrets) == [
        "algo.eps_clip=0.1",
        f"+rollout.sglang.api_key={REDACTED}",
        "parallelism.max_tokens_per_gpu=4096",
        f"x={REDACTED}",
    ]
