"""The ``opus-testbed`` command line: argument parsing and printing only; the work is in the
library packages beside it."""
