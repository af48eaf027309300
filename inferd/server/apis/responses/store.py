"""The stored responses behind previous_response_id and GET/DELETE /v1/responses/{id}: the most recent `size`, each
for `ttl_s`; a miss (never stored, evicted or expired) is the same 404."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferd.server.protocol import ProtocolError


@dataclass
class Stored:
    response: dict[str, Any]  # the response object as returned
    messages: list[dict[str, Any]]  # the whole conversation through this response, as chat messages
    expires: float


class ResponseStore:
    """Bounded (least recently stored go first) and time-limited; safe to use from several threads."""

    def __init__(self, size: int = 1000, ttl_s: float = 3600.0, clock: Callable[[], float] = time.monotonic):
        self.size, self.ttl_s, self._clock = size, ttl_s, clock
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[response["id"]] = Stored(response, messages, self._clock() + self.ttl_s)
            self._items.move_to_end(response["id"])
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> Stored | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None and item.expires <= self._clock():
                del self._items[response_id]
                return None
            return item

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)


def not_found(response_id: str) -> ProtocolError:
    return ProtocolError(f"Response with id '{response_id}' not found.", "response_id", status=404)
