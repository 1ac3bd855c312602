"""tests/deploy: the CLI commands as real processes, the deployment files, the netns cluster."""
