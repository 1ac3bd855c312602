"""Outbound gRPC: channels and stubs (transport), the I/O loop, retries, and the same-host
shared-memory route."""
