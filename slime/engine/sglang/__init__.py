"""The SGLang engine: real SGLang servers behind the router (docs/engines.md#sglang).

The only package that may import sglang, and only lazily: it must import on machines without sglang
(the CPU install), where `server_args` checks `rollout.sglang` against a pinned field list.
"""
