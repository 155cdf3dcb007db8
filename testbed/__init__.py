"""opus-testbed: the CLI, checks, runner and metrics that tie the packages together."""
