"""gradwire.server: the per-worker gRPC service."""
