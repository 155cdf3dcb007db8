"""CALIENT optical circuit switches (S160, S320, Edge640) over TL1, as Opus OCS back ends.

* :mod:`.wire` -- the TL1 command forms, the dotted port names and the reply fields, pure (the
  simulator in :mod:`emulator.calient` speaks the same forms);
* :mod:`.session` -- :class:`~.session.CalientSession`, one TL1 login on one switch, behind the
  same :class:`~controller.drivers.polatis.session.DeviceSession` interface as a Polatis login;
* :mod:`.config` -- the ``calient-tl1`` defaults of the ``ocs:`` setting and the factory the
  registry (:mod:`controller.drivers.registry`) names.

The driver itself is the device-neutral engine of :mod:`controller.drivers.polatis.driver`
(checks first, one batched edit per rail, re-read after every fault) over Calient sessions: a
session speaks in ``ingress -> egress`` pairs of an N x N view, and turns them into Calient
connections (a duplex rail circuit ``a <-> b`` is one ``2WAY`` connection ``a-b``). Errors are
the device errors of :mod:`controller.drivers.polatis.errors`, naming ``calient-tl1 host:port``.

What this package says about the protocol comes from public third-party code that drove real
switches, cited in ``docs/hardware.md``; what no public source settles is listed there too.
"""
