"""The built-in transformers engine: `engine.HFEngine` launches `server` (SGLang's HTTP subset)."""
