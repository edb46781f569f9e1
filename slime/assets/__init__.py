"""Assets the embedded default makes by code on first use: tokenizer, tiny model, synthetic task."""
