"""The simulated backend: the same plans and the same Opus core on a virtual clock."""
