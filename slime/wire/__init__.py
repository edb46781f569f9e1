"""The wire format: what trainers, weight syncs and engines all speak, and nothing else.

    tensors.py        a bucket of (HF name, tensor), dtype names, byte counts, a flat buffer's views
    bucket_codec.py   SGLang's serialised flattened bucket (`/update_weights_from_tensor`)
    weight_group.py   SGLang's weight-update process group (`/init_weights_update_group`), both ends
    bare_group.py     the bare gloo/NCCL group vLLM's weight transfer uses (the CPU fake's and the trainer's end)
    hf_dir.py         an HF checkpoint directory written from buckets (the disk sync, `checkpoint.save_hf`)

A leaf (docs/architecture.md#import-rules): `slime.train`, `slime.sync` and `slime.engine` import it; it imports no
slime package.
"""
