"""OCS drivers behind :class:`controller.ocs.OcsDriver`: emulated (the OCS app over HTTP),
simulated (virtual clock) and Polatis hardware (NETCONF, TL1)."""
