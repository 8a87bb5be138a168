"""Bloom filters over 16-byte keys, and the set of them a process holds, tested together.

A ``KeyFilter`` answers "surely not here" or "maybe" for a key: ``HASHES`` bits per key, from the key's two 64-bit
halves (double hashing), in a power of two of at least ``BITS_PER_ID`` bits per key, about 1 false "maybe" in
3,000 keys or fewer. A ``FilterSet`` keeps the filters of one size side by side in one array, so a call tests its
keys against all of them in a few array operations instead of a loop over filters: a day's window at 5,000
events/s is a few hundred filters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prefect_webhooks.utilities.runtime import lazy_module

np = lazy_module("numpy")

# 16 bits and 11 hashes per id: about 1 false hit in 2,000 at the least. A call of 1,000 new ids over a window of
# 100 sealed periods looks about 50 keys up in their tables, where one B-tree over the window looked up all 1,000.
BITS_PER_ID = 16
HASHES = 11


class Probe:
    """Keys as a filter tests them: their two 64-bit halves, and their bit positions per filter size (a call's
    filters mostly share a size, so the positions are worked out once for all of them)."""

    def __init__(self, keys: Sequence[bytes] = ()) -> None:
        self.halves = np.frombuffer(b"".join(keys), dtype="<u8").reshape(-1, 2)
        self._positions: dict[tuple[int, int], tuple[Any, Any]] = {}

    @classmethod
    def of_numbers(cls, numbers: Sequence[int]) -> Probe:
        """Keys that are already 64-bit hashes (signed): the second half is mixed from the first (splitmix64)."""
        probe = cls()
        first = np.array(numbers, dtype=np.int64).view(np.uint64)
        second = (first ^ (first >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        second = (second ^ (second >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        probe.halves = np.stack([first, second ^ (second >> np.uint64(31))], axis=1)
        return probe

    def positions(self, size: int, hashes: int) -> tuple[Any, Any]:
        """Per key and hash: the byte of the filter and the bit in it (double hashing; ``size`` a power of two)."""
        found = self._positions.get((size, hashes))
        if found is None:
            rounds = np.arange(hashes, dtype=np.uint64)
            bits = (self.halves[:, :1] + rounds[None, :] * self.halves[:, 1:]) & np.uint64(size - 1)
            found = self._positions[size, hashes] = (bits >> np.uint64(3), (bits & np.uint64(7)).astype(np.uint8))
        return found


class KeyFilter:
    """A Bloom filter over 16-byte keys: ``HASHES`` bits per key in a power of two of at least ``BITS_PER_ID``
    bits per key."""

    def __init__(self, bits: Any, hashes: int = HASHES) -> None:
        self.bits = bits
        self.hashes = hashes
        self.size = len(bits) * 8

    @classmethod
    def of_keys(cls, keys: Sequence[bytes]) -> KeyFilter:
        return cls.of_probe(Probe(keys))

    @classmethod
    def of_probe(cls, probe: Probe) -> KeyFilter:
        """The filter over the keys of ``probe``."""
        count = len(probe.halves)
        size = 1 << max(9, (count * BITS_PER_ID - 1).bit_length())
        marked = np.zeros(size, dtype=bool)
        if count:
            byte, bit = probe.positions(size, HASHES)
            marked[(byte.astype(np.int64) * 8 + bit).ravel()] = True
        return cls(np.packbits(marked, bitorder="little"))

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyFilter:
        return cls(np.frombuffer(data, dtype=np.uint8, offset=1), hashes=data[0])

    def to_bytes(self) -> bytes:
        return bytes([self.hashes]) + self.bits.tobytes()

    def may_hold(self, probe: Probe) -> list[int]:
        """The positions of the keys of ``probe`` that may be in the set; every other one surely is not."""
        byte, bit = probe.positions(self.size, self.hashes)
        held = np.arange(len(byte))
        for hashed in range(self.hashes):  # half the keys left go at each hash: test the few left, not all
            held = held[((self.bits[byte[held, hashed]] >> bit[held, hashed]) & 1).astype(bool)]
            if not held.size:
                break
        return held.tolist()


class FilterSet:
    """Named filters, those of one size stacked in one array (rebuilt when the set changes, a few times an hour)."""

    def __init__(self) -> None:
        self._filters: dict[str, KeyFilter] = {}
        self._stacks: dict[tuple[int, int], tuple[list[str], Any]] | None = {}

    def __contains__(self, name: object) -> bool:
        return name in self._filters

    def names(self) -> set[str]:
        return set(self._filters)

    @property
    def nbytes(self) -> int:
        return sum(kept.bits.nbytes for kept in self._filters.values())

    def add(self, name: str, kept: KeyFilter) -> None:
        self._filters[name] = kept
        self._stacks = None

    def discard(self, name: str) -> None:
        if self._filters.pop(name, None) is not None:
            self._stacks = None

    def _stacked(self) -> dict[tuple[int, int], tuple[list[str], Any]]:
        if self._stacks is None:
            by_shape: dict[tuple[int, int], list[str]] = {}
            for name, kept in self._filters.items():
                by_shape.setdefault((kept.size, kept.hashes), []).append(name)
            self._stacks = {}
            for shape, names in by_shape.items():
                stack = np.stack([self._filters[name].bits for name in names])
                for row, name in enumerate(names):  # the filters become views of the stack: one copy in memory
                    self._filters[name].bits = stack[row]
                self._stacks[shape] = (names, stack)
        return self._stacks

    def candidates(self, probe: Probe) -> dict[str, list[int]]:
        """Per filter: the positions of the keys of ``probe`` it may hold (a filter that holds none is left out)."""
        found: dict[str, list[int]] = {}
        count = len(probe.halves)
        for (size, hashes), (names, stack) in self._stacked().items():
            byte, bit = probe.positions(size, hashes)
            row = np.repeat(np.arange(len(names)), count)
            key = np.tile(np.arange(count), len(names))
            for hashed in range(hashes):  # half the pairs left go at each hash
                held = ((stack[row, byte[key, hashed]] >> bit[key, hashed]) & 1).astype(bool)
                row, key = row[held], key[held]
                if not row.size:
                    break
            for filter_row, position in zip(row.tolist(), key.tolist(), strict=True):
                found.setdefault(names[filter_row], []).append(position)
        return found
