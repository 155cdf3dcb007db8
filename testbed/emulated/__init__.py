"""The emulated backend: a run on Mininet hosts and OVS rails, one replayer process per rank."""
