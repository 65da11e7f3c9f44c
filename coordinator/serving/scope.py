"""What a client's version is consistent across, chosen by the ``warehouse`` it sends to ``/v1/config``.

    scope = Scope.from_warehouse("namespace:sales@pinned")   # or "", "all", "pipeline@2026-11-28T10:00:00Z"
    scope.prefix                                              # "ns.sales": every later request's path carries it
    Scope.from_prefix("ns.sales~le-1795834273000")           # what a request's prefix asks for

Grammar of ``warehouse`` (every engine can set it; an engine that cannot sends nothing, and a client may put it in
the URI's path instead, ``http://host:port/w/<warehouse>``): ``[GROUP][@PIN]``

- GROUP: a scope's group (``coordinator.protocol.pipelines``): ``pipeline`` (the default): each table at the newest
  version consistent across its pipeline; ``all``: one version across every table Tidemark's jobs write or read;
  ``namespace:<ns>``: one version across those of namespace ``<ns>``.
- PIN: none (the newest version on every load); ``pinned`` (the version newest when ``/v1/config`` was asked, for
  as long as the client keeps its configuration: a session); an epoch or a retained version's tag
  (``1795834273000``, ``tidemark-orders-1795834273000``: exactly that version); an ISO-8601 time
  (``2026-11-28T10:00:00Z``: the newest version at or before it).

A pin travels as ``~at-<T>`` (exactly ``T``) or ``~le-<T>`` (the newest at or before ``T``) in the prefix, so
the server keeps no session state and any replica answers any request.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Optional

from coordinator.errors import InvalidArgument, InvalidName
from coordinator.history.versions import tag_epoch
from coordinator.names import NAME_PATTERN, validate_epoch
from coordinator.protocol.pipelines import Group, parse_group

PINNED = "pinned"
_PREFIX = re.compile(rf"^(pipeline|all|ns\.(?P<ns>{NAME_PATTERN}))(?:~(?P<pin>at|le)-(?P<t>\d+))?$")


class PinKind(str, enum.Enum):
    """How a pinned scope chooses its version: exactly an epoch, or the newest at or before one."""

    EXACT = "at"
    AT_OR_BEFORE = "le"


@dataclass(frozen=True)
class Pin:
    """A scope's fixed version: ``kind`` applied to ``epoch`` (milliseconds since 1970)."""

    kind: PinKind
    epoch: int


@dataclass(frozen=True)
class Scope:
    """A client's scope: its ``group`` (and ``namespace`` for the namespace group), and its pin if any.

    ``pinned_at_config`` is set by a warehouse asking for ``@pinned``: the server replaces it with a pin of the
    version newest at that moment (``with_pin``) before it answers ``/v1/config``.
    """

    group: Group = Group.PIPELINE
    namespace: Optional[str] = None
    pin: Optional[Pin] = None
    pinned_at_config: bool = False

    @classmethod
    def from_warehouse(cls, warehouse: Optional[str]) -> Scope:
        """The scope a ``warehouse`` names (module docstring); ``InvalidArgument`` saying the grammar otherwise.

        :param warehouse: what the client sent, None or empty for the default scope.
        :raises InvalidArgument: a group or a pin that is not one of the grammar's.
        """
        text = (warehouse or "").strip()
        group_text, _, pin_text = text.partition("@")
        group, namespace = _group(group_text)
        if not pin_text:
            return cls(group, namespace)
        if pin_text == PINNED:
            return cls(group, namespace, pinned_at_config=True)
        return cls(group, namespace, _pin(pin_text))

    @classmethod
    def from_prefix(cls, prefix: str) -> Scope:
        """The scope a request's path prefix carries; ``InvalidArgument`` for one this server never hands out."""
        match = _PREFIX.match(prefix)
        if match is None:
            raise InvalidArgument(f"unknown catalog prefix {prefix!r}: ask /v1/config for the prefix of a warehouse "
                                  f"({WAREHOUSE_HELP})")
        ns = match.group("ns")
        group = Group.NAMESPACE if ns else Group(match.group(1))
        pin = Pin(PinKind(match.group("pin")), int(match.group("t"))) if match.group("pin") else None
        return cls(group, ns, pin)

    @property
    def prefix(self) -> str:
        """This scope as one URL path segment (``/v1/<prefix>/namespaces/...``)."""
        base = f"ns.{self.namespace}" if self.group == Group.NAMESPACE else self.group.value
        return base if self.pin is None else f"{base}~{self.pin.kind.value}-{self.pin.epoch}"

    def with_pin(self, pin: Pin) -> Scope:
        """This scope's group fixed at ``pin`` (``pinned_at_config`` cleared: how ``@pinned`` becomes a prefix)."""
        return Scope(self.group, self.namespace, pin)

    def describe(self) -> str:
        """The scope for messages: ``namespace sales, exactly 1795834273000``, ``pipeline group, newest version``."""
        group = f"namespace {self.namespace}" if self.group == Group.NAMESPACE else f"{self.group.value} group"
        if self.pin is None:
            return f"{group}, newest version"
        how = "exactly" if self.pin.kind == PinKind.EXACT else "newest at or before"
        return f"{group}, {how} {self.pin.epoch}"


WAREHOUSE_HELP = ("warehouse is [pipeline|all|namespace:<ns>][@pinned|@<epoch>|@tidemark-<pipeline>-<epoch>|"
                  "@<ISO-8601 time>], for example 'namespace:sales@pinned'")


def _group(text: str) -> tuple[Group, Optional[str]]:
    try:
        return parse_group(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"warehouse {text!r}: {exc}; {WAREHOUSE_HELP}") from None


def _pin(text: str) -> Pin:
    tagged = tag_epoch(text)  # a retained version's tag, whichever pipeline's
    if tagged is not None or text.isdigit():
        try:
            return Pin(PinKind.EXACT, validate_epoch(int(text) if tagged is None else tagged, "the pinned epoch"))
        except InvalidName as exc:
            raise InvalidArgument(str(exc)) from None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument(f"pin {text!r} is neither an epoch, a tag nor an ISO-8601 time: {WAREHOUSE_HELP}") \
            from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return Pin(PinKind.AT_OR_BEFORE, int(moment.timestamp() * 1000))


__all__ = ["WAREHOUSE_HELP", "Group", "Pin", "PinKind", "Scope"]
