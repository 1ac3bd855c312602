"""PyTorch's own RPC test suite, run on gradwire (and on torch itself, to prove the harness).

    scripts/torchsuite.sh [-j 2] [-k NAME] [--ratchet] [--json out.json]     # gradwire
    scripts/torchsuite.sh --impl torch [-j 2]                                # torch

``suite`` locates the test files in an installed torch wheel (``GRADWIRE_TORCH_PYTHON``) and
copies them, imports rewritten by ``rewrite``, into ``_work/<impl>/`` (git-ignored); ``shim``
stands in for what they import from ``torch.testing._internal`` (the fixture, ``dist_init``,
the process test case); ``runner`` runs each test as four ``worker`` processes with a hard
deadline and kills by process id; ``__main__`` prints per-class pass counts and wall time,
writes JSON, and checks ``passing.txt`` (the ratchet). ``not_applicable.toml`` is the one
reviewed list of tests that do not apply, in groups with their reasons.
"""
