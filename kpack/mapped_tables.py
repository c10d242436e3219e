"""Memory-mapped tables and arrays, and the read-only lookups over them (issue 20).

A version's index files (kpack.index_files) are Arrow IPC files of one record batch, sorted
by their key, and .npy arrays. A reader maps them (zero copy: several processes reading one
version share the pages) and finds a key by bisection over the sorted key column, or over the
key hashes a keyed table carries (write_keyed), so a query reads the rows it ranks and never a
table row by row. The writers here are the two halves of that format a build needs.
"""

from __future__ import annotations

import bisect
import math
import mmap
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from kpack.index_files import KEY_HASHES

STRING_BLOCK = 10_000  # texts converted to Python strings at a time


def map_file(path: Path, whole: bool = False) -> mmap.mmap:
    """``path`` mapped read-only. For scattered reads (the default: a query's) it is advised
    MADV_RANDOM, so that a page fault reads its own page: with the kernel's read-around, the
    first search of a cold pack read whole index files for a few rows of each (80 random rows
    of the 156 MB chunk matrix read all of it, bench/HISTORY.md stop 42), and once
    :func:`read_into_cache` has run the advice costs nothing. ``whole``: the caller reads all
    of it (a build reusing a version's vectors), and the kernel's read-ahead stays on."""
    with path.open("rb") as file:
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    if not whole:
        with suppress(AttributeError, OSError):  # no madvise on this platform: the default
            mapped.madvise(mmap.MADV_RANDOM)
    return mapped


def load_array(folder: Path, name: str, whole: bool = False) -> np.ndarray:
    """A saved array, memory-mapped read-only (:func:`map_file`, ``whole`` as there), as a
    plain ndarray over the map (np.memmap's Python-level indexing cost ~10 us per element
    read, which a query pays thousands of times)."""
    path = folder / name
    with path.open("rb") as file:
        version = np.lib.format.read_magic(file)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(file)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(file)
        else:
            raise ValueError(f"{path}: .npy format version {version} is not one kpack writes")
        offset = file.tell()
    if dtype.hasobject:
        raise ValueError(f"{path}: holds Python objects, which are not read from pack files")
    count = math.prod(shape)
    data = np.frombuffer(map_file(path, whole), dtype=dtype, count=count, offset=offset)
    return data.reshape(shape, order="F" if fortran else "C")


def load_table(folder: Path, name: str, whole: bool = False) -> pa.Table:
    """An Arrow IPC file, memory-mapped (:func:`map_file`, ``whole`` as there; zero copy)."""
    return pa.ipc.open_file(pa.py_buffer(map_file(folder / name, whole))).read_all()


def read_into_cache(folder: Path, block: int = 1 << 20) -> None:
    """Read every file of ``folder`` once, so that their pages are in the page cache and later
    faults on their maps read nothing: what a reader does in the background after its first
    answer (its maps are read a page at a time, :func:`map_file`). Read, not
    ``POSIX_FADV_WILLNEED``, which the kernel may cap at its read-ahead window. A folder or
    file removed meanwhile (a version pruned) is skipped."""
    buffer = bytearray(block)
    with suppress(OSError):
        for path in sorted(folder.iterdir()):
            with suppress(OSError), path.open("rb", buffering=0) as file:
                while file.readinto(buffer):
                    pass


def single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """A chunked column as one array. An empty table's column has no chunk, and Arrow's
    ``combine_chunks`` of none imports pandas (0.4 s): that one is made empty instead."""
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.nulls(0, column.type)
    return column.combine_chunks()


def column_array(column: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """A number or boolean column without nulls as an ndarray (numbers viewed in place, zero
    copy from a mapped file; booleans unpacked from their bits); None for any other column.
    Not ``to_numpy``: it imports pandas, 0.4 s of a fresh reader's first search."""
    if isinstance(column, pa.ChunkedArray):
        column = single_chunk(column)
    kind = column.type
    if column.null_count or not (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    ):
        return None
    start, end = column.offset, column.offset + len(column)
    data = column.buffers()[1]
    if pa.types.is_boolean(kind):
        bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
        return bits[start:end].astype(bool)
    letter = (
        "f" if pa.types.is_floating(kind) else "u" if pa.types.is_unsigned_integer(kind) else "i"
    )
    return np.frombuffer(data, dtype=np.dtype(f"{letter}{kind.bit_width // 8}"))[start:end]


class Column(Sequence[Any]):
    """One column of a memory-mapped table as a Python sequence (values read one at a time)."""

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        if isinstance(column, pa.ChunkedArray):
            column = single_chunk(column)
        self._column = column
        # ``value(row)`` reads one value from the column's buffers, through memoryviews (whose
        # items are Python ints and floats): Arrow's scalar access costs ~10 us a value, which
        # a binary search over a million keys pays 40 times, and a numpy scalar costs a
        # conversion. Chosen once here, so a read is one call (a record reads several).
        self.value: Callable[[int], Any]
        if pa.types.is_string(column.type) and column.null_count == 0:
            _, offsets, data = column.buffers()
            starts = memoryview(np.frombuffer(offsets, dtype=np.int32)[column.offset :])
            text = memoryview(data) if data is not None else memoryview(b"")

            def text_at(row: int) -> str:
                return str(text[starts[row] : starts[row + 1]], "utf-8")

            self.value = text_at
        elif (numbers := column_array(column)) is not None:
            self.value = memoryview(numbers).__getitem__
        else:
            self.value = lambda row: column[int(row)].as_py()

    def __len__(self) -> int:
        return len(self._column)

    def __getitem__(self, index: Any) -> Any:  # type: ignore[override]
        if isinstance(index, slice):
            return [self.value(i) for i in range(*index.indices(len(self)))]
        return self.value(index)

    def __iter__(self) -> Iterator[Any]:
        for value in self._column:
            yield value.as_py()


def key_hash(key: str) -> int:
    """A key's 64-bit hash, the same in every process (Python's hash() is salted per process)."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "little")


def write_keyed(folder: Path, name: str, table: pa.Table) -> None:
    """A table sorted by its unique first column, and that column's key hashes (KEY_HASHES):
    hashed a block at a time, sorted once."""
    write_arrow(folder / name, table)
    hashes = np.fromiter(
        (key_hash(key) for key in strings(table.column(0))), np.uint64, table.num_rows
    )
    order = np.argsort(hashes, kind="stable")
    np.save(folder / KEY_HASHES[name], np.stack([hashes[order], order.astype(np.uint64)]))


def write_arrow(path: Path, table: pa.Table) -> None:
    """A table as one record batch (a reader maps each column as one array, no copy); string
    columns too large for 32-bit offsets become large strings."""
    large = pa.schema(
        [
            field.with_type(pa.large_string())
            if pa.types.is_string(field.type)
            and sum(c.buffers()[2].size for c in table[field.name].chunks if c.buffers()[2])
            >= 2**31
            else field
            for field in table.schema
        ],
        metadata=table.schema.metadata,
    )
    table = table.cast(large).combine_chunks()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


def strings(column: pa.ChunkedArray) -> Iterator[str]:
    """The values of a string column, converted a block at a time (not a million at once)."""
    for start in range(0, len(column), STRING_BLOCK):
        yield from column.slice(start, STRING_BLOCK).to_pylist()


def keys_of(folder: Path, name: str, table: pa.Table) -> SortedKeys:
    """The keys of a keyed table the build wrote (write_keyed), with their hashes when the
    version has them."""
    hashes = KEY_HASHES[name]
    saved = load_array(folder, hashes) if (folder / hashes).is_file() else None
    return SortedKeys(table.column(0), hashes=saved)


class SortedKeys:
    """The positions of a key in a table's key column, by bisection over ``order`` (the rows in
    key order; the rows themselves when the table is sorted by that key). ``hashes`` (a keyed
    table's KEY_HASHES array) makes ``row`` a bisection over integers instead of strings."""

    def __init__(
        self,
        column: pa.ChunkedArray,
        order: np.ndarray | None = None,
        hashes: np.ndarray | None = None,
    ) -> None:
        self.values = Column(column)
        self.order = order
        self._hashes = None
        self._hash_array = None if hashes is None else hashes[0]
        if hashes is not None:  # memoryviews: bisect reads them as Python ints, no numpy call
            self._hashes = (memoryview(hashes[0]), memoryview(hashes[1]))

    def _key(self, position: int) -> Any:
        row = position if self.order is None else int(self.order[position])
        return self.values[row]

    def span(self, key: Any) -> range:
        keyed = _KeyView(self)
        return range(bisect.bisect_left(keyed, key), bisect.bisect_right(keyed, key))

    def rows(self, key: Any) -> list[int]:
        span = self.span(key)
        if self.order is None:
            return list(span)
        return [int(self.order[p]) for p in span]

    def row(self, key: Any) -> int | None:
        """The first row holding ``key``, or None (one bisection)."""
        if self._hashes is not None:
            hashes, rows = self._hashes
            wanted = key_hash(key)
            at = bisect.bisect_left(hashes, wanted)
            while at < len(hashes) and hashes[at] == wanted:  # another key may share the hash
                if self.values[rows[at]] == key:
                    return rows[at]
                at += 1
            return None
        keyed = _KeyView(self)
        at = bisect.bisect_left(keyed, key)
        if at == len(keyed) or keyed[at] != key:
            return None
        return at if self.order is None else int(self.order[at])

    def rows_of_many(self, keys: Collection[str]) -> dict[str, int]:
        """The first row of each key the table holds (absent keys are left out): with key
        hashes, one vectorised search for them all, where ``row`` costs a bisection each (a
        question's every phrase of up to eight words, looked up as a possible entity name)."""
        if self._hash_array is None:
            return {key: row for key in keys if (row := self.row(key)) is not None}
        wanted = list(keys)
        hashes = np.fromiter((key_hash(key) for key in wanted), np.uint64, len(wanted))
        starts = np.searchsorted(self._hash_array, hashes)
        ends = np.searchsorted(self._hash_array, hashes, side="right")
        _, rows = self._hashes  # set with _hash_array
        found: dict[str, int] = {}
        for at in np.flatnonzero(ends > starts).tolist():  # the keys whose hash is there
            key = wanted[at]
            # Another key may share the hash: the key column says which row is this key's.
            for position in range(int(starts[at]), int(ends[at])):
                if self.values[rows[position]] == key:
                    found[key] = rows[position]
                    break
        return found


@dataclass(frozen=True)
class _KeyView(Sequence[Any]):
    keys: SortedKeys

    def __len__(self) -> int:
        return len(self.keys.values)

    def __getitem__(self, position: Any) -> Any:  # type: ignore[override]
        return self.keys._key(position)


V = TypeVar("V")


class Lookup(Mapping[str, V]):
    """A read-only mapping over a memory-mapped index: a subclass says what ``found(key)`` is
    (None when the key is absent) and how to list its keys."""

    def found(self, key: str) -> V | None:
        raise NotImplementedError

    def found_many(self, keys: Collection[str]) -> dict[str, V]:
        """The keys present, with their values."""
        return {key: value for key in keys if (value := self.found(key)) is not None}

    def __getitem__(self, key: str) -> V:
        value = self.found(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:  # one lookup, no KeyError raised
        value = self.found(key)
        return default if value is None else value


class _TableLookup(Lookup[V]):
    """A lookup over a table sorted by its first column (``keys``, by default found by
    bisection); ``make`` builds the values from ``columns`` (default all, in table order),
    so a lookup decodes only what its values hold (not a section's whole text to read its
    heading). A column the table lacks is left out, for ``make``'s default to fill in (a
    version built before the column existed)."""

    def __init__(
        self,
        table: pa.Table,
        make: Any,
        keys: SortedKeys | None = None,
        columns: Sequence[str] | None = None,
    ) -> None:
        self.table = table
        self.keys = keys or SortedKeys(table.column(0))
        self._make = make
        self._columns = [c for c in columns or table.column_names if c in table.column_names]
        self._values: list[Callable[[int], Any]] | None = None  # each column's reader


class RowMap(_TableLookup[Any]):
    """A table sorted by its first column as a read-only mapping key -> ``make(row)``."""

    def row(self, key: str) -> int | None:
        return self.keys.row(key)

    def record(self, row: int) -> Any:
        if self._values is None:  # made at first use: a table only iterated needs none
            self._values = [Column(self.table[name]).value for name in self._columns]
        return self._make(*[value(row) for value in self._values])

    def found(self, key: str) -> Any:
        row = self.row(key)
        return None if row is None else self.record(row)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys.values)

    def __len__(self) -> int:
        return self.table.num_rows


class GroupMap(_TableLookup[list]):
    """A table sorted by its first column as key -> the ``make(*rest)`` of its rows, in order."""

    def found(self, key: str) -> list | None:
        span = self.keys.span(key)
        if not span:
            return None
        part = self.table.slice(span.start, len(span)).to_pylist()
        names = self.table.column_names[1:]
        return [self._make(*(item[n] for n in names)) for item in part]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self.keys.values))

    def __len__(self) -> int:
        return len(set(self.keys.values))


class RowOf(Lookup[int]):
    """Key -> row of a table sorted by that key (its first column)."""

    def __init__(self, keys: SortedKeys) -> None:
        self.keys = keys

    def found(self, key: str) -> int | None:
        return self.keys.row(key)

    def found_many(self, keys: Collection[str]) -> dict[str, int]:
        return self.keys.rows_of_many(keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys.values)

    def __len__(self) -> int:
        return len(self.keys.values)


class RowsOf(Lookup[list]):
    """Key -> the rows holding it, for a column the table is not sorted by (``keys.order``)."""

    def __init__(self, keys: SortedKeys) -> None:
        self.keys = keys

    def found(self, key: str) -> list[int] | None:
        return self.keys.rows(key) or None

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(self.keys.values))

    def __len__(self) -> int:
        return len(set(self.keys.values))


class Neighbours(Lookup[list]):
    """Article url -> the urls it links to or is linked from (CSR over article rows)."""

    def __init__(self, urls: SortedKeys, offsets: np.ndarray, targets: np.ndarray) -> None:
        self.urls, self.offsets, self.targets = urls, offsets, targets

    def found(self, url: str) -> list[str] | None:
        row = self.urls.row(url)
        if row is None or self.offsets[row] == self.offsets[row + 1]:
            return None
        linked = self.targets[self.offsets[row] : self.offsets[row + 1]]
        return [self.urls.values[int(r)] for r in linked]

    def __iter__(self) -> Iterator[str]:
        for row in np.flatnonzero(np.diff(self.offsets)):
            yield self.urls.values[int(row)]

    def __len__(self) -> int:
        return int(np.count_nonzero(np.diff(self.offsets)))
