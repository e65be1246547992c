"""A registry of the resource kinds the sweeper knows, and the delete order built from it.

Each ``Kind`` declares how its resources are found (``discover``), how their deletion starts
(``delete``), how the sweeper knows it is complete (``gone``), and which kinds must be gone
before it can be deleted (``after``: its consumers, e.g. a security group ``after`` the
instances and interfaces in it). ``Registry.delete_order`` is a topological sort of those
dependencies (ties in registration order, so the order is reproducible), never a hand-written
list. Report-only kinds (S3 buckets, capacity reservations) are discovered and reported but
have no ``delete``/``gone`` and are never in the delete order.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

# discover(ctx) -> [Found]; delete(client, found) -> None; gone(client, found) -> bool, where
# ``client(service)`` is a boto3 client of the region (see scripts/ops/sweeping/kinds.py).
Discover = Callable[[Any], list[Any]]
Delete = Callable[[Callable[[str], Any], Any], None]
Gone = Callable[[Callable[[str], Any], Any], bool]


class RegistrationError(ValueError):
    """A kind cannot be registered, or the registered dependencies have no order (one line)."""


@dataclass(frozen=True)
class Kind:
    """One kind of resource the sweeper finds and (unless ``report_only``) deletes.

    Attributes:
        name: the ``Found.kind`` value, e.g. ``ec2-instance``.
        label: plural noun for messages (``could not list <label>``).
        discover: ``ctx -> [Found]``: this kind's resources of ours in ``ctx.region``.
        delete: ``(client, found) -> None``: starts the deletion (may return before it is complete).
        gone: ``(client, found) -> bool``: whether the deletion is complete; may itself take the
            last step when that has to wait for others (deleting a volume once it is detached).
        after: names of kinds whose resources must be gone before this kind is deleted.
        report_only: found and reported, never deleted (then ``delete`` and ``gone`` are None). A
            report-only kind that cannot be listed is *unknown* in the report, not an error: nothing
            the sweeper would delete can hide behind it.
        calls: the AWS API calls ``discover`` makes (``ec2:DescribeCapacityReservations``), named
            when the endpoint cannot answer them.
    """

    name: str
    label: str
    discover: Discover
    delete: Delete | None = None
    gone: Gone | None = None
    after: tuple[str, ...] = ()
    report_only: bool = False
    calls: tuple[str, ...] = ()


class Registry:
    """Kinds by name, in registration order (which is also the discovery order)."""

    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}

    def register(self, kind: Kind) -> Kind:
        """Add ``kind``; returns it.

        Raises:
            RegistrationError: the name is taken; a deletable kind lacks ``delete`` or ``gone``;
                a report-only kind has one; or the kind lists itself in ``after``.
        """
        if kind.name in self._kinds:
            raise RegistrationError(f"kind {kind.name!r} is already registered")
        if kind.report_only:
            if kind.delete is not None or kind.gone is not None or kind.after:
                raise RegistrationError(f"kind {kind.name!r} is report-only: it has no delete, gone or after")
        else:
            missing = [n for n, fn in (("delete", kind.delete), ("gone", kind.gone)) if fn is None]
            if missing:
                raise RegistrationError(
                    f"kind {kind.name!r} has no {' and no '.join(missing)}: every deletable kind declares how its "
                    "deletion starts (delete) and how it is confirmed (gone); or register it report_only=True"
                )
        if kind.name in kind.after:
            raise RegistrationError(f"kind {kind.name!r} cannot be deleted after itself")
        self._kinds[kind.name] = kind
        return kind

    def __iter__(self) -> Iterator[Kind]:
        return iter(self._kinds.values())

    def __getitem__(self, name: str) -> Kind:
        return self._kinds[name]

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def report_only(self) -> tuple[str, ...]:
        """Names of the report-only kinds, in registration order."""
        return tuple(k.name for k in self if k.report_only)

    def delete_order(self) -> tuple[str, ...]:
        """Names of the deletable kinds, each after every kind in its ``after`` (Kahn's algorithm;
        of the kinds ready at a step, the earliest registered goes first).

        Raises:
            RegistrationError: an ``after`` names an unknown or report-only kind, or the
                dependencies form a cycle (the kinds left are named).
        """
        deletable = [k for k in self if not k.report_only]
        names = {k.name for k in deletable}
        for k in deletable:
            unknown = [a for a in k.after if a not in names]
            if unknown:
                raise RegistrationError(f"kind {k.name!r} is deleted after {', '.join(unknown)}: not a deletable kind")
        done: list[str] = []
        waiting = list(deletable)
        while waiting:
            ready = next((k for k in waiting if all(a in done for a in k.after)), None)
            if ready is None:
                raise RegistrationError("kinds whose `after` form a cycle: " + ", ".join(k.name for k in waiting))
            done.append(ready.name)
            waiting.remove(ready)
        return tuple(done)
