"""The OCS app's datapath purges: rails that ask together share one, and none returns early."""

from __future__ import annotations

import threading
import time

from emulator.ocs_app import _DatapathFlusher

WAIT_S = 10.0


class _GatedFlusher(_DatapathFlusher):
    """Purges that block until the test lets them finish, recording when each began."""

    def __init__(self) -> None:
        super().__init__()
        self.began: list[threading.Event] = []
        self.release: list[threading.Event] = []
        self._new = threading.Condition()

    def _purge(self) -> None:
        with self._new:
            began, release = threading.Event(), threading.Event()
            self.began.append(began)
            self.release.append(release)
            began.set()
            self._new.notify_all()
        assert release.wait(10.0), "the test never released a purge"

    def wait_purges(self, count: int) -> None:
        with self._new:
            assert self._new.wait_for(lambda: len(self.began) >= count, 10.0)


def _start_flush(flusher: _DatapathFlusher) -> threading.Thread:
    thread = threading.Thread(target=flusher.flush, daemon=True)
    thread.start()
    return thread


def test_callers_during_a_purge_share_the_next_one_and_wait_for_it() -> None:
    flusher = _GatedFlusher()
    first = _start_flush(flusher)
    flusher.wait_purges(1)
    # Three rails ask while purge 1 runs: purge 1 began before them, so it cannot serve them.
    later = [_start_flush(flusher) for _ in range(3)]
    deadline = time.monotonic() + WAIT_S
    while flusher.waiting < 3:  # all three asked (and wait) before purge 1 ends
        assert time.monotonic() < deadline, "the three callers never waited for purge 1"
        time.sleep(0.001)
    flusher.release[0].set()
    first.join(10.0)
    assert not first.is_alive()
    flusher.wait_purges(2)
    assert all(t.is_alive() for t in later), "a caller returned on a purge that began before it"
    flusher.release[1].set()
    for t in later:
        t.join(10.0)
        assert not t.is_alive()
    assert len(flusher.began) == 2, "the three callers should have shared one purge"


def test_a_caller_alone_gets_its_own_purge() -> None:
    flusher = _GatedFlusher()
    for n in range(1, 3):
        thread = _start_flush(flusher)
        flusher.wait_purges(n)
        flusher.release[n - 1].set()
        thread.join(10.0)
        assert not thread.is_alive()
    assert len(flusher.began) == 2
