"""The pure data model: leaves, state trees, boxes and manifests (no MPI, no I/O)."""
