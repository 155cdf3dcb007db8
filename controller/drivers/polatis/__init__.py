"""Polatis optical circuit switches as Opus OCS back ends: NETCONF and TL1 drivers.

* :mod:`.ports` -- how rail ports map onto an N x N switch (rail port ``p`` = ingress ``p`` and
  egress ``N+p``; a duplex circuit ``a <-> b`` = pairs ``a -> N+b`` and ``b -> N+a``);
* :mod:`.xml` and :mod:`.tl1` -- the wire formats, pure;
* :mod:`.netconf` / :mod:`.tl1` -- one management session per switch;
* :mod:`.driver` -- :class:`PolatisDriver`, the :class:`~controller.ocs.OcsDriver` over one
  switch per rail (checks first, re-reads the glass after every fault);
* :mod:`.config` -- the Polatis defaults of the ``ocs:`` setting and the factory the registry
  (:mod:`controller.drivers.registry`) names; :mod:`.errors` -- the device errors.

The device simulator and the emulated OCS's NETCONF front live in :mod:`emulator.polatis`.

The package imports none of its modules: import them by name (no cycle between the package
and its submodules).
"""
