"""A CALIENT switch in software: the device model and its TL1 agent.

* :mod:`.model` -- :class:`~.model.CalientDevice`: duplex dotted ports, two-step connections
  (reserve, activate), light, switching time, faults;
* :mod:`.tl1_server` -- :class:`~.tl1_server.CalientTl1Server`, the agent (127.0.0.1,
  background thread or foreground);
* :mod:`.front` -- :func:`~.front.calient_fronts`, one agent per emulated rail, backed by real
  OVS circuits (``driver: calient-tl1`` in an emulated run; :mod:`emulator.fronts` picks it).
"""
