"""OCS drivers behind :class:`controller.ocs.OcsDriver`: emulated (the OCS app over HTTP),
simulated (virtual clock) and Polatis hardware (NETCONF, TL1).

:data:`DRIVERS` is the one list of names an experiment's ``ocs.driver`` may take. The simulated
driver is not among them: it comes with the sim backend (``--backend sim``), never from a file.
"""

#: drivers that talk to a Polatis switch (a lab switch, or the emulated OCS's fronts)
HARDWARE_DRIVERS = ("polatis-netconf", "polatis-tl1")
#: every value of an experiment's ``ocs.driver``
DRIVERS = ("emulated", *HARDWARE_DRIVERS)
