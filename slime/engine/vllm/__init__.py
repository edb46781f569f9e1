"""vLLM engines (`rollout.engine=vllm`): servers started from vLLM's own entry point, behind vllm-router."""
