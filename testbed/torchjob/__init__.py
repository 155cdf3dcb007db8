"""PyTorch jobs on the emulated rails: capture of a torch run into the workload format."""
