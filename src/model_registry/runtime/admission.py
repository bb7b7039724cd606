"""Admission before work: a request is priced and admitted, or refused, before anything costly.

Pricing reads only what the request already holds (the number of inputs and their characters),
never a tokenizer or a decoder. A model admits a request when the cost queued ahead of it plus its
own can be served before the request's deadline at the model's measured rate; otherwise it answers
`Overloaded` (429) with a Retry-After from that same rate. Until a model has measured its rate, it
admits a few batches' worth of work at a time, which the first batches then measure. An answer's
size is bounded the same way: `OutputLimit` estimates it from the inputs and refuses a larger one.

Priority is the server's policy: `client_priority` is the one place a client's wish is applied.
"""

from __future__ import annotations

import contextvars
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from model_registry.errors import InvalidInput, Overloaded
from model_registry.types import ClassifyItem, EmbedItem, Item, Media, Mixed, Output, PairItem, TokenIds

#: Characters per token assumed when pricing text before it is tokenized (English WordPiece and
#: BPE average four or more; three keeps the price on the safe side).
CHARS_PER_TOKEN = 3
#: What one image or clip is priced at when the model does not say (patches or frames).
MEDIA_COST = 256
#: The least cost a model admits while it has not measured its rate yet (four batches' worth when
#: that is more): enough for a burst of ordinary requests at start, small enough to be served in
#: seconds by any model whose batches are that large.
COLD_START_COST = 16_384
#: The class a request gets when it does not ask: bulk work. Raising above it needs permission.
BULK = 0


#: When the current request reached the server (`time.monotonic()`), set by the edge as it
#: arrives: its deadline counts from then, so time spent reading and parsing the body counts too.
arrival: contextvars.ContextVar[float | None] = contextvars.ContextVar("arrival", default=None)


def deadline_after(seconds: float) -> float:
    """The monotonic deadline of the current request: `seconds` after it arrived (or from now)."""
    arrived = arrival.get()
    return (time.monotonic() if arrived is None else arrived) + seconds


def client_priority(requested: int | None, *, may_raise: bool) -> int | None:
    """The priority a client may have: `requested` when lowering, or when allowed to raise.

    A client lowers its request freely. Without the `priority` scope (or the server's
    `allow_client_priority`), a priority above the bulk class is replaced by None: the server's own
    default for the request's size (small queries rank above bulk), never above it.
    """
    if requested is None or may_raise or requested <= BULK:
        return requested
    return None


def price(items: Sequence[Item], max_length: int | None) -> int:
    """The cost `items` will have in the model's queue, estimated from what they hold now."""
    return sum(_item_price(item, max_length) for item in items)


def tokenizing_price(items: Sequence[Item]) -> int:
    """What tokenizing `items` reads, in tokens: a text is tokenized whole before it is cut, so a
    truncating text counts here by all of its characters, not at the model's limit."""
    return price(items, None)


def _item_price(item: Item, max_length: int | None) -> int:
    if isinstance(item, EmbedItem):
        content = item.content
        if isinstance(content, Media | Mixed):  # visual tokens are known once the image is decoded
            return max_length or MEDIA_COST
        tokens = len(content.ids) if isinstance(content, TokenIds) else _tokens(len(item.prompt) + len(content.text))
        truncate = item.truncate
    elif isinstance(item, PairItem):
        if item.media is not None:  # an image document: its visual tokens are known once decoded
            return max_length or MEDIA_COST
        tokens = _tokens(len(item.query) + len(item.document) + len(item.instruction or ""))
        truncate = item.truncate
    elif isinstance(item, ClassifyItem):
        tokens, truncate = _tokens(len(item.text) + len(item.pair or "")), item.truncate
    else:
        return 1
    return min(tokens, max_length) if truncate and max_length else tokens


def _tokens(chars: int) -> int:
    return math.ceil(chars / CHARS_PER_TOKEN) + 2  # the model's special tokens


@dataclass(frozen=True, slots=True)
class OutputLimit:
    """The largest answer a request may have: `max_bytes`, at `bytes_per_number` bytes for each
    number of its vectors in the answer's `encoding` (a description for the message)."""

    max_bytes: int
    bytes_per_number: float
    encoding: str = "float32"

    def check(self, items: Sequence[Item], max_length: int | None, width: int | None) -> None:
        """`InvalidInput` (400), before any work, when the answer to `items` may be larger.

        The estimate counts a vector of `width` numbers per dense output, and per token of a
        multi-vector output, each item having as many tokens as its price, at most `max_length`
        (a longer text is cut or refused). Sparse outputs are not counted: their size follows the
        vocabulary's activations, not the input."""
        if width is None:
            return
        vectors = sum(_vectors(item, max_length) for item in items)
        size = vectors * width * self.bytes_per_number
        if size > self.max_bytes:
            raise InvalidInput(
                f"the answer to these {len(items):,} inputs may take about {size / 2**20:,.1f} MiB "
                f"({vectors:,} vectors of {width:,} numbers at about {self.bytes_per_number:.3g} bytes each as "
                f"{self.encoding}), more than the server's max_output_bytes of {self.max_bytes / 2**20:,.1f} MiB; "
                "send fewer or shorter inputs in each request, or a more compact encoding (base64, int8, binary)",
                param="input",
            )


def _vectors(item: Item, max_length: int | None) -> int:
    """How many vectors the answer to `item` may hold: one per dense output, one per token of a
    multi-vector output."""
    if not isinstance(item, EmbedItem):
        return 0
    tokens = _item_price(item, max_length)
    tokens = min(tokens, max_length) if max_length else tokens
    if item.max_tokens is not None:
        tokens = min(tokens, item.max_tokens)
    return (Output.DENSE in item.outputs) + (Output.MULTIVECTOR in item.outputs) * tokens


@dataclass(eq=False)
class Reservation:
    """A request's share of its model's backlog, held until the request is answered."""

    backlog: Backlog
    priority: int
    cost: int
    released: bool = field(default=False, repr=False)

    def reprice(self, cost: int) -> None:
        """Replace the estimate with the cost the prepared items really have."""
        self.backlog.adjust(self, cost)

    def release(self) -> None:
        self.backlog.release(self)


class Backlog:
    """The cost admitted to one model and not yet answered, by priority class. Thread-safe.

    `rate` gives the model's measured cost per second (0 while unmeasured); `headroom` is the
    share of the time left before a deadline that admission may plan to fill (the rest absorbs
    the rate's noise and the prepare stage); `probe` is the cost admitted while unmeasured.
    """

    def __init__(self, rate: Callable[[], float], *, headroom: float = 0.7, probe: int = 4096) -> None:
        self._rate = rate
        self.headroom = headroom
        self.probe = probe
        self._by_class: dict[int, int] = {}
        self._lock = threading.Lock()

    def admit(self, cost: int, priority: int, seconds_left: float) -> Reservation:
        """Reserve `cost` in class `priority`, or raise `Overloaded` when it cannot be served in
        `seconds_left`: the work of its class and above is served first, its own after."""
        rate = self._rate()
        with self._lock:
            ahead = sum(c for p, c in self._by_class.items() if p >= priority)
            if rate > 0:
                can_serve = rate * seconds_left * self.headroom
                if ahead + cost > can_serve and ahead > 0:
                    wait = (ahead + cost - can_serve) / rate
                    raise Overloaded(
                        f"the model cannot serve this request before its deadline: {ahead:,} units of work are "
                        f"ahead of its {cost:,} at {rate:,.0f} units/s, with {seconds_left:.3g}s left",
                        retry_after=float(max(1, math.ceil(wait))),
                    )
            elif ahead > 0 and ahead + cost > self.probe:
                raise Overloaded(
                    "the model is measuring its rate on its first batches; retry in a moment", retry_after=1.0
                )
            self._by_class[priority] = self._by_class.get(priority, 0) + cost
        return Reservation(self, priority, cost)

    def adjust(self, reservation: Reservation, cost: int) -> None:
        with self._lock:
            if not reservation.released:
                self._by_class[reservation.priority] += cost - reservation.cost
                reservation.cost = cost

    def release(self, reservation: Reservation) -> None:
        with self._lock:
            if reservation.released:
                return
            reservation.released = True
            left = self._by_class[reservation.priority] - reservation.cost
            if left:
                self._by_class[reservation.priority] = left
            else:
                del self._by_class[reservation.priority]

    @property
    def cost(self) -> int:
        """The cost admitted and not yet answered, all classes."""
        with self._lock:
            return sum(self._by_class.values())
