"""MoE routing: the routes format shared by engines and trainers (`routes`), and transformers router hooks (`hf_routers`)."""
