"""PyTorch jobs on the emulated rails: the opus backend, its launcher and runner, capture."""
