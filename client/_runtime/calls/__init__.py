"""A call, both halves: the caller, the callee, the routes a call takes, call streams, the
serving pool and the call hooks."""
