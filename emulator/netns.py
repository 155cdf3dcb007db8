"""Network namespaces per thread: a thread that enters one opens its sockets there.

A socket belongs to the network namespace of the thread that created it, for its whole life,
whatever namespace the threads that later use it are in; and a thread starts in the namespace of
the thread that started it. So one process can host several ranks, each in its own Mininet
host's namespace: each rank's first thread enters the namespace (:func:`enter_netns`) before it
opens anything, and every thread it starts (its lanes, its listener's threads, its shims'
heartbeat and ZeroMQ I/O threads) inherits it. A Mininet host's namespace is reachable as
``/proc/<pid of the host's shell>/ns/net`` (:func:`netns_path`).

Python 3.11 has no ``os.setns`` (3.12 does); this calls libc's ``setns(2)`` through ctypes. Only
the calling thread moves (``CLONE_NEWNET`` is allowed in a multithreaded process); entering needs
``CAP_SYS_ADMIN`` (root). Only the network namespace moves: files, the mount namespace and the
process's pid stay as they were.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket

CLONE_NEWNET = 0x40000000
#: ioctl on a socket: a new fd of the network namespace the socket belongs to (Linux >= 4.9)
SIOCGSKNS = 0x894C
_libc: ctypes.CDLL | None = None


def netns_path(pid: int) -> str:
    """The network namespace of process ``pid`` (e.g. a Mininet host's shell)."""
    return f"/proc/{pid}/ns/net"


def netns_id(path: str = "/proc/thread-self/ns/net") -> int:
    """The identity (inode) of a namespace; by default the calling thread's."""
    return os.stat(path).st_ino


def socket_netns_id(sock: socket.socket) -> int:
    """The identity of the namespace ``sock`` belongs to (where it was created)."""
    fd = fcntl.ioctl(sock.fileno(), SIOCGSKNS)
    try:
        return os.fstat(fd).st_ino
    finally:
        os.close(fd)


def enter_netns(path: str) -> None:
    """Move the calling thread (only it) into the network namespace at ``path``."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
