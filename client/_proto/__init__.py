"""Generated stubs of protos/gradwire/_proto/worker.proto. Do not edit."""
