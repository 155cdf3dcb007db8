"""The Opus artifact's line protocol, pure: parsing, the request encoding, and its mapping to
this controller's intents.

The public artifact (``opusfabric/Opus`` at ``53f8d51``) has a C++ ``c10d`` shim
(``src/opus-shim``) that speaks lines over one TCP connection per process to its controller
(``src/opus-controller/controller.cpp``, port 1234). Written from a reading of that source (no
code taken); ``docs/artifact-protocol.md`` maps each rule to its file and line.

Lines (``\\n``-terminated; a trailing ``\\r`` is dropped, an empty line is ignored)::

    COMM;<comm id>,<nranks>,<local rank>        -> CHECKIN_ACK;<comm id>,<domain>
    CONFIG_REQ;<comm id>,<backend id>,<counter> -> CONFIG_ACK;<comm id>

``CHECKIN_ACK`` goes to every member once ``nranks`` members checked in; ``domain`` is 1 when
they all sit on one server (scale-up: the shim then never asks), else 0. A ``CONFIG_REQ`` whose
backend id is above :data:`PP_BACKEND_INTERVAL` is a pipeline request: pipeline group
``g = backend // 10`` (the higher of two adjacent stages, whose bits ``g - 1`` and ``g`` it
sets; the counter must carry ``g * PP_INTERVAL``); any other is a data-parallel request of stage
``counter // PP_INTERVAL`` (whose bit it clears). The call number is ``counter % PP_INTERVAL``.

How a request becomes an :class:`~controller.core.Intent` (:class:`ArtifactBook`): the peer
address gives the server (its index in ``SERVER_IPS``, :class:`ServerMap`), the local rank is
the GPU's index there and its rail, so the rank is ``server * gpus_per_server + local rank``
(this testbed's numbering, :mod:`controller.job`). A comm's members, once all checked in, name
the job's comm group: for a data-parallel request the group with exactly those ranks, not a
pipeline group if another has them, never a pipeline pair (so a ``pp`` ring: the pipeline's
all-reduce, which the artifact's shim never gates but port-exact does, asks as a data-parallel
request, its counter carrying the ring's first stage); for a pipeline request the ``pp`` group
of the two members in stages ``g - 1`` and ``g`` (a ``pairs`` group before a ring of the same
ranks). The intent carries that group,
the call number as its ``seq`` and the group's axis; the switching model (port-exact or
rail-state) is the core's, as for the testbed's own shim.

Anything that cannot be mapped raises :class:`ArtifactError`; the shell logs it and answers
nothing (the protocol has no error reply: the artifact's shim times out after 10 s).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from controller.job import CommGroup, JobSpec
from controller.messages import Intent

#: the artifact's counter offset per pipeline stage (``PP_INTERVAL``)
PP_INTERVAL = 1_000_000
#: backend ids above this are pipeline requests; ``backend // 10`` is the pipeline group
PP_BACKEND_INTERVAL = 10
#: the artifact controller's fixed port (``PORT``)
DEFAULT_PORT = 1234
#: the backend id this project's clients use for a data-parallel comm (any id <= 10 will do)
DP_BACKEND = 2
#: the artifact's shim's own pipeline backend id (its second process group)
PP_BACKEND = 1
#: longest line accepted; a longer one is malformed (the artifact reads 4096-byte chunks)
MAX_LINE_BYTES = 4096

_INT = re.compile(r"[0-9]{1,9}")
_COMM_ID = re.compile(r"[0-9A-Za-z_\-]{1,256}")


class ArtifactError(ValueError):
    """A line or request that cannot be served; ``code`` is a short machine name."""

    def __init__(self, message: str, code: str = "malformed") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class CommLine:
    """``COMM;<comm>,<nranks>,<local rank>``: a process checks in one communicator."""

    comm: str
    nranks: int
    local_rank: int


@dataclass(frozen=True)
class ConfigReqLine:
    """``CONFIG_REQ;<comm>,<backend>,<counter>``: a request for one call's circuits."""

    comm: str
    backend: int
    counter: int


def _fields(body: str, header: str) -> tuple[str, int, int]:
    parts = body.split(",")
    if len(parts) != 3:
        raise ArtifactError(f"{header} needs 3 comma-separated fields, got {len(parts)}")
    comm, a, b = parts
    if not _COMM_ID.fullmatch(comm):
        raise ArtifactError(f"{header}: comm id {comm[:80]!r} is not 1-256 letters or digits")
    if not _INT.fullmatch(a) or not _INT.fullmatch(b):
        raise ArtifactError(f"{header}: {a[:20]!r} and {b[:20]!r} must be integers >= 0")
    return comm, int(a), int(b)


def parse_line(line: str) -> CommLine | ConfigReqLine | None:
    """One line without its ``\\n``; None for an empty line (ignored, as the artifact does);
    :class:`ArtifactError` for anything else that is not a well-formed request."""
    line = line.removesuffix("\r")
    if not line:
        return None
    header, sep, body = line.partition(";")
    if not sep:
        raise ArtifactError(f"no ';' after the header in {line[:80]!r}")
    if header == "COMM":
        comm, nranks, local = _fields(body, header)
        if nranks < 1:
            raise ArtifactError(f"COMM: nranks must be >= 1, got {nranks}")
        return CommLine(comm, nranks, local)
    if header == "CONFIG_REQ":
        return ConfigReqLine(*_fields(body, header))
    raise ArtifactError(f"unknown header {header[:40]!r} (COMM or CONFIG_REQ)")


def checkin_ack(comm: str, domain: int) -> bytes:
    return f"CHECKIN_ACK;{comm},{domain}\n".encode()


def config_ack(comm: str) -> bytes:
    return f"CONFIG_ACK;{comm}\n".encode()


@dataclass(frozen=True)
class Decoded:
    """What a request's backend id and counter say: pipeline or not, the stage (for a
    pipeline request the pipeline group, the higher of its two stages) and the call number."""

    pp: bool
    stage: int
    seq: int


def decode_request(backend: int, counter: int) -> Decoded:
    """Decode as the artifact's controller does (``determine_runtime_topo``)."""
    if backend > PP_BACKEND_INTERVAL:
        group = backend // PP_BACKEND_INTERVAL
        if counter // PP_INTERVAL != group:
            raise ArtifactError(f"pipeline backend id {backend} names pipeline group {group} "
                                f"but counter {counter} is in group {counter // PP_INTERVAL}")
        return Decoded(True, group, counter % PP_INTERVAL)
    return Decoded(False, counter // PP_INTERVAL, counter % PP_INTERVAL)


def encode_request(pp: bool, stage: int, seq: int, backend: int = DP_BACKEND) -> tuple[int, int]:
    """(backend id, counter) of call ``seq`` as the artifact's shim sends it (``topowrite``):
    pipeline (``stage`` = the higher stage of the pair) or data-parallel of ``stage``."""
    if not 0 <= seq < PP_INTERVAL:
        raise ArtifactError(f"call number {seq} does not fit below {PP_INTERVAL}")
    if pp:
        if stage < 1:
            raise ArtifactError(f"a pipeline pair's higher stage is >= 1, got {stage}")
        return PP_BACKEND + PP_BACKEND_INTERVAL * stage, stage * PP_INTERVAL + seq
    if backend > PP_BACKEND_INTERVAL:
        raise ArtifactError(f"a data-parallel backend id is <= {PP_BACKEND_INTERVAL}")
    return backend, stage * PP_INTERVAL + seq


def comm_id(job_id: str, group_id: str) -> str:
    """A 64-hex-digit comm id for a group (the artifact sends 32 bytes of NCCL's id in hex)."""
    return hashlib.sha256(f"{job_id}/{group_id}".encode()).hexdigest().upper()


# ----------------------------------------------------------------- addresses and servers


class ServerMap:
    """``SERVER_IPS``: entry ``i`` is server ``i``'s address, or a list of its addresses (an
    emulated server's ranks each have their own)."""

    def __init__(self, entries: Sequence[str | Sequence[str]]) -> None:
        self.entries = [[e] if isinstance(e, str) else list(e) for e in entries]
        self._server: dict[str, int] = {}
        for index, addrs in enumerate(self.entries):
            for addr in addrs:
                key = _normal_ip(addr, "server_ips")
                if key in self._server:
                    raise ArtifactError(f"server_ips: {addr} is listed for servers "
                                        f"{self._server[key]} and {index}", "config")
                self._server[key] = index

    def server_of(self, ip: str) -> int | None:
        try:
            return self._server.get(_normal_ip(ip, "peer"))
        except ArtifactError:
            return None


def _normal_ip(text: str, what: str) -> str:
    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError as exc:
        raise ArtifactError(f"{what}: {text!r} is not an IP address", "config") from exc


def check_listen_host(host: str, trusted: Iterable[str] = ()) -> str:
    """The address to bind the artifact's protocol on, refused unless it is loopback or named
    in ``trusted``: the protocol has no authentication. A wildcard address is always refused."""
    addr = _normal_ip("127.0.0.1" if host == "localhost" else host, "listen")
    ip = ipaddress.ip_address(addr)
    if ip.is_unspecified:
        raise ArtifactError(f"listen: {host} binds every interface; the artifact's protocol "
                            "has no authentication, so bind loopback or one trusted "
                            "interface's own address", "config")
    if ip.is_loopback:
        return addr
    trusted_ips = {_normal_ip(t, "trusted") for t in trusted}
    if addr not in trusted_ips:
        raise ArtifactError(f"listen: {host} is not loopback; the artifact's protocol has no "
                            "authentication, so any host that reaches it could switch circuits. "
                            f"Bind 127.0.0.1, or name {addr} under artifact_protocol.trusted "
                            "if only trusted hosts reach that interface", "config")
    return addr


# ------------------------------------------------------------------------------ the book


@dataclass
class _Comm:
    nranks: int
    members: dict[int, int] = field(default_factory=dict)  # connection -> rank
    servers: set[int] = field(default_factory=set)
    complete: bool = False


@dataclass(frozen=True)
class Request:
    """A mapped ``CONFIG_REQ``: the intent to send, on behalf of ``conn``'s rank."""

    conn: int
    comm: str
    intent: Intent


class ArtifactBook:
    """The comms, their members and the request -> intent mapping of one job (pure)."""

    def __init__(self, job: JobSpec, servers: ServerMap, gpus_per_server: int) -> None:
        if gpus_per_server < 1:
            raise ArtifactError(f"gpus_per_server must be >= 1, got {gpus_per_server}", "config")
        self.job = job
        self.servers = servers
        self.gpus_per_server = gpus_per_server
        self.n_rails = 1 + max((rp.rail for rp in job.ranks.values()), default=0)
        self.comms: dict[str, _Comm] = {}
        self._groups: dict[tuple[str, bool, int], CommGroup] = {}

    def rank_of(self, peer_ip: str, local_rank: int) -> int:
        """The job's rank at ``local_rank`` of the server ``peer_ip`` belongs to."""
        server = self.servers.server_of(peer_ip)
        if server is None:
            raise ArtifactError(f"peer {peer_ip} is not in server_ips", "unknown_server")
        if local_rank >= self.n_rails:
            raise ArtifactError(f"local rank {local_rank} exceeds the {self.n_rails} rails "
                                "(the artifact puts local rank L on rail L)", "bad_rail")
        rank = server * self.gpus_per_server + local_rank
        rp = self.job.ranks.get(rank)
        if rp is None:
            raise ArtifactError(f"job {self.job.job_id} has no rank {rank} (server {server}, "
                                f"local rank {local_rank})", "unknown_rank")
        if rp.rail != local_rank:
            raise ArtifactError(f"rank {rank} is on rail {rp.rail}, but the artifact puts local "
                                f"rank {local_rank} on rail {local_rank}", "bad_rail")
        return rank

    def on_comm(self, conn: int, peer_ip: str, line: CommLine) -> list[tuple[int, bytes]]:
        """A check-in; returns the ``CHECKIN_ACK`` lines to send (to every member once the comm
        is complete)."""
        rank = self.rank_of(peer_ip, line.local_rank)
        comm = self.comms.get(line.comm)
        if comm is None:
            comm = self.comms[line.comm] = _Comm(line.nranks)
        elif comm.nranks != line.nranks:
            raise ArtifactError(f"comm {line.comm[:16]}: {line.nranks} ranks, but its first "
                                f"check-in said {comm.nranks}", "nranks_mismatch")
        if conn in comm.members:
            raise ArtifactError(f"comm {line.comm[:16]}: this connection checked in already",
                                "duplicate")
        if comm.complete:
            raise ArtifactError(f"comm {line.comm[:16]}: all {comm.nranks} ranks checked in "
                                "already", "comm_full")
        if rank in comm.members.values():
            raise ArtifactError(f"comm {line.comm[:16]}: rank {rank} checked in already",
                                "duplicate")
        comm.members[conn] = rank
        comm.servers.add(rank // self.gpus_per_server)
        if len(comm.members) < comm.nranks:
            return []
        comm.complete = True
        domain = 1 if len(comm.servers) == 1 else 0
        return [(c, checkin_ack(line.comm, domain)) for c in comm.members]

    def on_config_req(self, conn: int, line: ConfigReqLine) -> Request:
        """A request, as the intent of the requesting connection's rank."""
        comm = self.comms.get(line.comm)
        if comm is None:
            raise ArtifactError(f"CONFIG_REQ for comm {line.comm[:16]} that nobody checked in",
                                "unknown_comm")
        rank = comm.members.get(conn)
        if rank is None:
            raise ArtifactError(f"CONFIG_REQ for comm {line.comm[:16]} from a connection that "
                                "did not check it in", "not_member")
        if not comm.complete:
            raise ArtifactError(f"CONFIG_REQ for comm {line.comm[:16]} before all its "
                                f"{comm.nranks} ranks checked in", "comm_incomplete")
        dec = decode_request(line.backend, line.counter)
        group = self.group_for(line.comm, comm, dec)
        if rank not in group.ranks:
            raise ArtifactError(f"rank {rank} is not in group {group.group_id}, which the "
                                f"request names", "not_member")
        return Request(conn, line.comm, Intent(self.job.job_id, rank, group.group_id, dec.seq,
                                               "", 0, group.axis))

    def group_for(self, comm_id_: str, comm: _Comm, dec: Decoded) -> CommGroup:
        """The job's group a request of ``comm`` names (see the module docstring)."""
        key = (comm_id_, dec.pp, dec.stage)
        found = self._groups.get(key)
        if found is not None:
            return found
        members = set(comm.members.values())
        stages = self.job.stages
        groups = sorted(self.job.groups.values(), key=lambda g: g.group_id)
        if dec.pp:
            if stages is not None:
                pair = {r for r in members if stages[r] in (dec.stage - 1, dec.stage)}
            else:
                pair = members if len(members) == 2 else set()
            found_list = [g for g in groups if g.axis == "pp" and set(g.ranks) == pair]
            pairs = [g for g in found_list if g.kind == "pairs" or g.pairs is not None]
            found_list = pairs or found_list
            what = f"pipeline stages {dec.stage - 1}-{dec.stage} of ranks {sorted(members)}"
        else:
            same = [g for g in groups if set(g.ranks) == members]
            found_list = ([g for g in same if g.axis != "pp"]
                          or [g for g in same if g.kind != "pairs" and g.pairs is None])
            what = f"ranks {sorted(members)} (other than a pipeline pair)"
            first = min((stages[r] for r in members), default=0) if stages is not None else None
            if found_list and first is not None and dec.stage != first:
                raise ArtifactError(f"the counter says stage {dec.stage}, but the comm's ranks "
                                    f"{sorted(members)} start at stage {first}", "bad_stage")
        if not found_list:
            raise ArtifactError(f"job {self.job.job_id} has no group of {what}", "unknown_group")
        if len(found_list) > 1:
            raise ArtifactError(f"job {self.job.job_id} has several groups of {what}: "
                                f"{', '.join(g.group_id for g in found_list)}", "ambiguous_group")
        self._groups[key] = found_list[0]
        return found_list[0]

    def drop(self, conn: int) -> None:
        """A connection closed: it leaves the comms it had not completed (a complete comm keeps
        its members, as the artifact's does)."""
        for comm in self.comms.values():
            if not comm.complete and conn in comm.members:
                del comm.members[conn]
                comm.servers = {r // self.gpus_per_server for r in comm.members.values()}


def group_comms(job: JobSpec, rank: int) -> Mapping[str, CommGroup]:
    """The groups ``rank`` is a member of, by comm id: what its process checks in."""
    return {comm_id(job.job_id, g.group_id): g for g in job.groups.values() if rank in g.ranks}
