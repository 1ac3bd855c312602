"""The copied PyTorch test files under _work/ are run by python -m torchsuite, never by pytest."""

collect_ignore_glob = ["_work/*"]
