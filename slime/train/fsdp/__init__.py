"""torch + transformers training backend (`parallelism.backend=fsdp`)."""
