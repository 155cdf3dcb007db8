"""NETCONF over SSH message framing (RFC 6242).

Hellos, and every message of a base:1.0 session, end with ``]]>]]>``; once both hellos announce
base:1.1 the session switches to chunked framing: ``\\n#<size>\\n<data>`` chunks, then
``\\n##\\n``. :class:`Framer` hands out one message at a time so that the switch can happen
between the hello and the next message even when both arrive in one read.
"""

from __future__ import annotations

EOM = b"]]>]]>"
MAX_CHUNK = 4294967295


class FrameError(ValueError):
    """The peer broke the framing; the session must be dropped."""


class Framer:
    """Incremental decoder for both framings; set ``chunked`` after the hello exchange."""

    def __init__(self, *, max_message_bytes: int = 16 * 2**20) -> None:
        self.chunked = False
        self.max_message_bytes = max_message_bytes
        self._buf = bytearray()
        self._msg = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data
        if len(self._buf) + len(self._msg) > self.max_message_bytes:
            raise FrameError(f"message larger than {self.max_message_bytes} bytes")

    def pop(self) -> bytes | None:
        """The next complete message, or None until more data arrives."""
        if not self.chunked:
            end = self._buf.find(EOM)
            if end < 0:
                return None
            msg = bytes(self._buf[:end])
            del self._buf[:end + len(EOM)]
            return msg
        while True:
            if len(self._buf) < 4:
                return None
            if self._buf.startswith(b"\n##\n"):
                del self._buf[:4]
                msg, self._msg = bytes(self._msg), bytearray()
                return msg
            if not self._buf.startswith(b"\n#"):
                raise FrameError(f"expected a chunk header, got {bytes(self._buf[:12])!r}")
            nl = self._buf.find(b"\n", 2)
            if nl < 0:
                if len(self._buf) > 13:
                    raise FrameError("chunk header too long")
                return None
            digits = bytes(self._buf[2:nl])
            if not digits.isdigit() or digits.startswith(b"0") or int(digits) > MAX_CHUNK:
                raise FrameError(f"bad chunk size {digits!r}")
            size = int(digits)
            if len(self._buf) < nl + 1 + size:
                return None
            self._msg += self._buf[nl + 1:nl + 1 + size]
            del self._buf[:nl + 1 + size]


def encode(message: bytes, *, chunked: bool) -> bytes:
    """Frame one message for sending."""
    if not chunked:
        return message + EOM
    return b"\n#%d\n" % len(message) + message + b"\n##\n" if message else b"\n##\n"
