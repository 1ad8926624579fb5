"""Where bytes come from and where they go: sources, safetensors headers, the writer."""
