"""OCS drivers behind :class:`controller.ocs.OcsDriver`: emulated (the OCS app over HTTP),
simulated (virtual clock), Polatis hardware (NETCONF, TL1) and CALIENT hardware (TL1).

:mod:`.registry` names the drivers an experiment's ``ocs.driver`` may take, with each one's
config parser, factory and whether it is hardware; :mod:`.config` holds what their ``ocs:``
settings share.
"""
