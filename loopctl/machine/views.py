"""Read-only views of the machine's message lists: live (``MessagesView``) and frozen (``ConversationSnapshot``).

Both are O(1) to make: the machine only ever appends to its lists or
replaces them wholesale, so a view never copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Union, cast, overload

from loopctl.messages import Message


class MessagesView(Sequence[Message]):
    """A live, read-only view of one of the machine's message lists (no copy)."""

    __slots__ = ("_items",)

    def __init__(self, items: list[Message]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Message, list[Message]]:
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, MessagesView):
            return self._items == other._items
        if isinstance(other, (list, tuple)):
            return self._items == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"MessagesView({self._items!r})"


class ConversationSnapshot(Sequence[Message]):
    """A stable, read-only snapshot of ``prefix + history + pending``, made in O(1).

    It stays valid because the machine only ever appends to its lists or
    replaces them wholesale; the snapshot keeps each list and its length.
    """

    __slots__ = ("_segments", "_len")

    def __init__(self, segments: Sequence[tuple[Sequence[Message], int]]) -> None:
        # Kept flat (list, length, list, length, ...): one tuple, not one per
        # segment, as a snapshot lives for a whole model call of every run in flight.
        flat: list[Union[Sequence[Message], int]] = []
        total = 0
        for items, n in segments:  # a plain loop: two or three segments, no generator to build
            flat += (items, n)
            total += n
        self._segments = tuple(flat)
        self._len = total

    def _pairs(self) -> Iterator[tuple[Sequence[Message], int]]:
        segs = self._segments
        for j in range(0, len(segs), 2):
            yield cast("Sequence[Message]", segs[j]), cast(int, segs[j + 1])

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> list[Message]: ...

    def __getitem__(self, index: Union[int, slice]) -> Union[Message, list[Message]]:
        if isinstance(index, slice):
            return list(self)[index]
        i = index + self._len if index < 0 else index
        if not 0 <= i < self._len:
            raise IndexError("conversation index out of range")
        for items, n in self._pairs():
            if i < n:
                return items[i]
            i -= n
        raise IndexError("conversation index out of range")  # pragma: no cover

    def __iter__(self) -> Iterator[Message]:
        for items, n in self._pairs():
            if n == len(items):
                yield from items
            else:
                for k in range(n):
                    yield items[k]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple, ConversationSnapshot)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ConversationSnapshot({list(self)!r})"


__all__ = ["ConversationSnapshot", "MessagesView"]
