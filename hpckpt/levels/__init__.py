"""Multi-level checkpointing: node-local storage with partner or XOR redundancy."""
