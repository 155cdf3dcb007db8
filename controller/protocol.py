"""The shim <-> controller protocol: JSON objects, one per ZeroMQ message (DEALER <-> ROUTER).

ZeroMQ does the framing, reconnection and queueing; this module only encodes, decodes and
validates messages, so that malformed input is refused with an error that names the field.

Requests (client -> controller); every request that expects a reply carries an integer ``req``
that the reply echoes:

=============  ==========================================================  ==================
type           fields                                                      reply
=============  ==========================================================  ==================
hello          job, rank, shim, req                                        welcome / error
intent         job, rank, shim, req, group, seq, kind, size_bytes, axis    ack / error
complete       job, rank, shim, group, seq, next (null or {group, seq,     none (error if bad)
               kind, size_bytes, axis}: the predicted next call)
predict        job, rank, shim, group, seq, kind, size_bytes, axis: a      none (error if bad);
               call named ahead of time (rail-state provisioning);         with answer: ready
               with ``answer: true`` and ``req``, answered once the        once the call may
               call may run without waiting for its switch                 run, or error
heartbeat      job, rank, shim                                             heartbeat_ok
bye            shim                                                        none
register       req, job (see :meth:`controller.job.JobSpec.to_json`)       registered / error
unregister     req, job_id                                                 unregistered / error
ping / stats   req                                                         pong / stats
=============  ==========================================================  ==================

Replies: ``welcome {req, controller, rail, ports}``, ``ack {req, group, seq, reconfigured, t_s}``,
``error {req, code, message}``, ``heartbeat_ok {controller}``, ``registered {req, job}``,
``stats {req, counters}``, ``ready {req, group, seq}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from controller.core import Intent

#: A call whose switch failed (error ``reconfig_failed``: the controller undid it, no byte of
#: the call moved) is asked for again, at most this many times per call. One rule for every
#: client: the replayer's shim, the simulator's ranks and the artifact gateway.
CALL_RETRIES = 3


def may_retry(code: str, retries: int) -> bool:
    """Whether a call refused with ``code``, already asked again ``retries`` times, asks again."""
    return code == "reconfig_failed" and retries < CALL_RETRIES


class ProtocolError(ValueError):
    """A malformed message; ``code`` is sent back in the error reply."""

    def __init__(self, message: str, code: str = "malformed") -> None:
        super().__init__(message)
        self.code = code


# one compact encoder for every message: json.dumps with separators builds a new encoder per
# call, which is a good part of a message's cost on the ack path
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def encode(msg: Mapping[str, Any]) -> bytes:
    return _ENCODER.encode(msg).encode()


def decode(data: bytes) -> dict[str, Any]:
    """Parse one message; raises :class:`ProtocolError` unless it is a JSON object with a type."""
    try:
        msg = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"message is not JSON: {exc}") from exc
    if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
        raise ProtocolError("message must be a JSON object with a string 'type'")
    return msg


def field_int(msg: Mapping[str, Any], key: str, minimum: int | None = 0) -> int:
    value = msg.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProtocolError(f"'{key}' must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ProtocolError(f"'{key}' must be >= {minimum}, got {value}")
    return value


def field_str(msg: Mapping[str, Any], key: str, required: bool = True) -> str:
    value = msg.get(key, None if required else "")
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise ProtocolError(f"'{key}' must be a non-empty string, got {value!r}")
    return value


def parse_intent(msg: Mapping[str, Any]) -> Intent:
    """The intent in an ``intent`` message."""
    return Intent(
        job_id=field_str(msg, "job"),
        rank=field_int(msg, "rank"),
        group_id=field_str(msg, "group"),
        seq=field_int(msg, "seq"),
        kind=field_str(msg, "kind", required=False),
        size_bytes=field_int(msg, "size_bytes") if "size_bytes" in msg else 0,
        axis=field_str(msg, "axis", required=False),
    )


def parse_next(msg: Mapping[str, Any], job_id: str, rank: int) -> Intent | None:
    """The predicted next call carried by a ``complete`` message, if any."""
    nxt = msg.get("next")
    if nxt is None:
        return None
    if not isinstance(nxt, Mapping):
        raise ProtocolError(f"'next' must be an object or null, got {nxt!r}")
    return parse_intent({**nxt, "job": job_id, "rank": rank})
