"""L3 runtime: the agent, transport, RRef context and dist-autograd glue (no public API)."""
