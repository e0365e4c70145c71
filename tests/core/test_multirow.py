"""Many rows in one statement: the same rows as one statement per row, cut into known chunks."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from crashqueuelab.core.multirow import LARGEST_CHUNK, RowsStatement, chunks, run_rows

_INSERT = RowsStatement("INSERT INTO t (k, v) VALUES {rows}", width=2)
# The rows' values first, then the shared ones: the list is named ahead of the update.
_UPDATE = RowsStatement(
    "WITH r(k, old) AS (VALUES {rows}) UPDATE t SET v = ? FROM r WHERE t.k = r.k AND t.v = r.old",
    width=2,
)


@pytest.fixture
def table() -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
    yield conn
    conn.close()


def _rows(conn: sqlite3.Connection) -> list[tuple[int, str]]:
    return list(conn.execute("SELECT k, v FROM t ORDER BY k"))


@pytest.mark.parametrize("count", [0, 1, 2, 3, 63, 64, 65, 127, 200, 1000])
def test_chunks_cover_every_row_once_in_powers_of_two(count: int) -> None:
    cut = chunks(count)
    assert sum(size for _, size in cut) == count
    assert [start for start, _ in cut] == [
        sum(size for _, size in cut[:at]) for at in range(len(cut))
    ]
    assert all(size & (size - 1) == 0 and 1 <= size <= LARGEST_CHUNK for _, size in cut)
    # Whole chunks of the largest size first, then each smaller size at most once.
    smaller = [size for _, size in cut if size < LARGEST_CHUNK]
    assert smaller == sorted(set(smaller), reverse=True)


@pytest.mark.parametrize("count", [1, 5, 64, 100, 300])
def test_run_rows_inserts_what_one_statement_a_row_inserts(
    table: sqlite3.Connection, count: int
) -> None:
    rows = [(n, f"v{n}") for n in range(count)]
    assert run_rows(table, _INSERT, rows) == count
    one_by_one = sqlite3.connect(":memory:", isolation_level=None)
    try:
        one_by_one.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        one_by_one.executemany("INSERT INTO t (k, v) VALUES (?, ?)", rows)
        assert _rows(table) == _rows(one_by_one)
    finally:
        one_by_one.close()


def test_run_rows_counts_only_the_rows_whose_guard_held(table: sqlite3.Connection) -> None:
    run_rows(table, _INSERT, [(n, "old") for n in range(100)])
    table.execute("UPDATE t SET v = 'moved' WHERE k % 7 = 0")
    changed = run_rows(table, _UPDATE, [(n, "old") for n in range(100)], ("new",))
    assert changed == 100 - len(range(0, 100, 7))
    assert {v for k, v in _rows(table) if k % 7 == 0} == {"moved"}
    assert {v for k, v in _rows(table) if k % 7} == {"new"}


def test_an_empty_list_runs_nothing(table: sqlite3.Connection) -> None:
    assert run_rows(table, _UPDATE, [], ("new",)) == 0
    assert _rows(table) == []


def test_a_row_of_the_wrong_width_is_refused_before_its_chunk_runs(
    table: sqlite3.Connection,
) -> None:
    with pytest.raises(ValueError, match="rows of 2 values"):
        run_rows(table, _INSERT, [(1, "a"), (2,), (3, "c")])
    assert _rows(table) == []


def test_a_statement_too_wide_for_a_chunk_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        RowsStatement("INSERT INTO t VALUES {rows}", width=16)


def test_each_chunk_size_has_one_text_with_its_rows() -> None:
    sizes = [1, 2, 4, 8, 16, 32, 64]
    assert [_INSERT.text(size).count("(?, ?)") for size in sizes] == sizes
    with pytest.raises(KeyError):
        _INSERT.text(3)
