"""The RRef protocol: the transport-free state machine (protocol, owner, user, messages, ids,
value, views, errors) and the service that drives it on a worker (service, calls, fetch, send,
shutdown, wire, outcome)."""
