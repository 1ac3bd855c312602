"""The worker and its cluster: identity and options (WorkerContext), events, rendezvous and
barriers, failure detection, device maps."""
