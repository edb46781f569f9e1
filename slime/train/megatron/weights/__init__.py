"""HF <-> megatron-core weights: name/layout mapping (names), tensor-parallel split math (sharding), HF files."""
