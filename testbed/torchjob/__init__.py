"""PyTorch jobs on the emulated rails: the opus backend, its launcher and runner, and the
capture of a torch run into the workload format."""
