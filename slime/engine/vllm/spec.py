"""The vLLM engine's record (slime.registry): `rollout.engine=vllm`."""

from slime.engine.vllm.check import check, check_unchosen
from slime.engine.vllm.config import VLLMOptions
from slime.registry import Checks, EngineFacts, Spec

SPECS = (
    Spec(
        seam="rollout.engine",
        name="vllm",
        target=".engine.VLLMEngine",
        facts=EngineFacts(
            kind="vLLM servers",
            router="vllm-router",
            abort_path="/abort_requests",
            abort_all_flag=False,
            generate_protocol=".protocol",
            prefill_decode_groups=True,
            memory_fraction_key="vllm.gpu_memory_utilization",  # vLLM 0.32.0 CacheConfig.gpu_memory_utilization
            memory_fraction_default=0.92,
            plan_line=".engine_args.plan_line",
            lora_adapter_modes=("disk",),  # /v1/load_lora_adapter reads a peft directory; no route takes tensors
            node_span_flags=("--nnodes", "--node-rank", "--master-addr/--master-port"),  # node ranks >= 1 --headless
        ),
        checks=Checks(check=check, check_unchosen=check_unchosen),
        config=VLLMOptions,
    ),
)
