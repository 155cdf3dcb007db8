"""What one input to the Opus core produces: :class:`Output`, with its acks, rejects, decisions
and event-log records, and :data:`LazyEvent`, an event recorded now and built when read.

Every public method of the core (:class:`controller.core.OpusCore`) returns one Output; the call
book and the switching model write into it through its public surface only: ``acks``,
``rejects`` and ``decisions`` are lists, and :meth:`Output.emit` records an event (a dict, or a
:data:`LazyEvent` tuple). A leaf below the call book and the models, so both import it without
a cycle.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

from controller.messages import Ack, Decision, Event, Reject

__all__ = ["Event", "LazyEvent", "Output"]

_FRESH: Any = object()  # "a new empty list" (what default_factory=list gives) for Output

#: An event not built yet: ``(builder, *fields)``; ``builder(record, into)`` appends the event
#: dict(s) it stands for to ``into``. The hot paths record these instead of dicts, so an event
#: costs a tuple unless someone reads :attr:`Output.events`.
LazyEvent = tuple[Any, ...]


_T = TypeVar("_T")


class _ListOnUse(Generic[_T]):
    """A list attribute of :class:`Output` kept in the slot named ``slot``, where ``None``
    stands for an empty list not made yet: the list is made when first read."""

    __slots__ = ("slot",)

    def __init__(self, slot: str) -> None:
        self.slot = slot

    @overload
    def __get__(self, obj: None, owner: object = None) -> _ListOnUse[_T]: ...

    @overload
    def __get__(self, obj: Output, owner: object = None) -> list[_T]: ...

    def __get__(self, obj: Output | None, owner: object = None) -> list[_T] | _ListOnUse[_T]:
        if obj is None:
            return self
        got: list[_T] | None = getattr(obj, self.slot)
        if got is None:
            got = []
            setattr(obj, self.slot, got)
        return got

    def __set__(self, obj: Output, value: list[_T]) -> None:
        setattr(obj, self.slot, value)


class Output:
    """Everything one event produced: acks, rejects, decisions and event-log records.

    ``events`` are built when first read (the core records the frequent ones as
    :data:`LazyEvent` tuples): every reader gets the same dicts, in the same order, as if they
    had been built on the spot; the core never records a value that changes afterwards.
    ``acks``, ``rejects`` and ``decisions`` are lists made when first read or written (most
    outputs have none of some): fewer objects per intent for the allocator and the garbage
    collector, the same lists for every reader.

    Writers (the call book, a switching model) use only the public surface: :meth:`emit` for
    an event, :meth:`take_acks` or ``acks.append`` for acks, ``rejects.append`` and
    ``decisions.append``.
    """

    __slots__ = ("_acks", "_built", "_decisions", "_events", "_rejects")

    def __init__(self, acks: list[Ack] = _FRESH, rejects: list[Reject] = _FRESH,
                 decisions: list[Decision] = _FRESH, events: list[Event] = _FRESH) -> None:
        self._acks: list[Ack] | None = None if acks is _FRESH else acks
        self._rejects: list[Reject] | None = None if rejects is _FRESH else rejects
        self._decisions: list[Decision] | None = None if decisions is _FRESH else decisions
        self._events: list[Event | LazyEvent] = [] if events is _FRESH else events  # type: ignore[assignment]
        self._built: list[Event] | None = None  # _events, once every record in it is built

    acks: _ListOnUse[Ack] = _ListOnUse("_acks")
    rejects: _ListOnUse[Reject] = _ListOnUse("_rejects")
    decisions: _ListOnUse[Decision] = _ListOnUse("_decisions")

    @property
    def events(self) -> list[Event]:
        """The event-log records (a list the caller may change), built on first read."""
        raw = self._events
        if raw is self._built:  # (read before: nothing was recorded since, only extend adds)
            return raw  # type: ignore[return-value]
        for e in raw:
            if e.__class__ is not dict:
                break
        else:
            self._built = raw  # type: ignore[assignment]
            return raw  # type: ignore[return-value]
        built: list[Event] = []
        for e in raw:
            if isinstance(e, dict):
                built.append(e)
            else:
                e[0](e, built)
        self._events = self._built = built  # type: ignore[assignment]
        return built

    @events.setter
    def events(self, events: list[Event]) -> None:
        self._events = events  # type: ignore[assignment]
        self._built = None

    def emit(self, event: Event | LazyEvent) -> None:
        """Record one event: a dict (an :data:`~controller.messages.Event`, built now) or a
        :data:`LazyEvent` tuple ``(builder, *fields)`` (built when :attr:`events` is first
        read; every field must be a value that does not change afterwards)."""
        self._events.append(event)

    def take_acks(self, acks: list[Ack]) -> None:
        """Add ``acks`` (the list itself becomes this output's when it has none yet: one
        list fewer per acknowledged call)."""
        if self._acks is None:
            self._acks = acks
        else:
            self._acks += acks

    def extend(self, other: Output) -> None:
        if other._acks:
            self.acks.extend(other._acks)
        if other._rejects:
            self.rejects.extend(other._rejects)
        if other._decisions:
            self.decisions.extend(other._decisions)
        # other's records built first: a list .events handed out stays a list of dicts
        self._events.extend(other.events)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Output)
        return (self.acks, self.rejects, self.decisions, self.events) == (
            other.acks, other.rejects, other.decisions, other.events)

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it replaces

    def __repr__(self) -> str:
        return (f"Output(acks={self.acks!r}, rejects={self.rejects!r}, "
                f"decisions={self.decisions!r}, events={self.events!r})")
