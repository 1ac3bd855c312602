"""gradwire: distributed RPC, remote references and distributed autograd."""
