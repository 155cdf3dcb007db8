"""Emulated photonic rails: Mininet ranks, OVS rail bridges as OCSes under an os-ken app."""
