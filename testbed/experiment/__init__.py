"""Experiments: the file format, preparing a run, sweeps over delays and modes, and
cross-validation of the two backends."""
