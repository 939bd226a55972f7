"""config.json -> mapping -> MoE shape. Never imports torch, triton or transformers."""
