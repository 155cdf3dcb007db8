"""Which datapath flows enter given ports: ``ovs-appctl dpctl/dump-flows --names`` read (pure).

Why the OCS app needs it (issue 35, ``docs/performance.md``, "Lost SYNs"): OVS's
``revalidator/purge`` deletes every cached datapath flow *except* one whose revalidation is
running at that moment (the purge takes each flow's lock with a ``trylock`` and skips a flow a
revalidator holds). A switch's removal starts such a revalidation, so a purge sent right after
the removal can miss the old circuit's flow; the revalidation then rewrites it with the dark
table's verdict, ``drop``, and that flow outlives the dark period until the light's own
revalidation rewrites it again, 1-3 ms after the light is confirmed. Frames a rank sends on
the acknowledgement meet the stale ``drop``: a lost SYN costs TCP's 1 s SYN timeout. The app
therefore purges until a dump shows no flow entering the touched ports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_IN_PORT = re.compile(r"(?:^|,)in_port\(([^)]*)\)")


def in_port(line: str) -> str | None:
    """The ``in_port`` of one flow line of ``dpctl/dump-flows`` (a port name with ``--names``,
    else the datapath's port number as text), or None for a line that is not a flow."""
    m = _IN_PORT.search(line)
    return m.group(1) if m else None


def flows_entering(dump_text: str, ports: Iterable[str]) -> list[str]:
    """The flow lines of ``dump_text`` whose ``in_port`` is one of ``ports`` (names, as
    ``--names`` prints them)."""
    wanted = set(ports)
    return [line.strip() for line in dump_text.splitlines() if in_port(line) in wanted]
