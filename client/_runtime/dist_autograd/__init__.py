"""Distributed autograd: the transport-free container and FAST-mode engine (engine), and the
service that hooks calls and sends gradients (service)."""
