"""The quant configs of a checkpoint: the documents, what they declare, vLLM's exclusion
rule, the audit against the stored tensors, and the rewrites (one module per job)."""
