"""Torn tails are repaired; every other damage is CorruptStore, never silent. In both
segment formats: the seed's (frames appended, the default) and the preallocated option."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.walqueue.helpers import (
    LAYOUTS,
    Layout,
    build_big,
    preallocated,
    put_txn,
    unfinished_shapes,
)
from walqueue import CorruptStore, Queue
from walqueue.codec import decode_frames, encode_frame
from walqueue.store import SEGMENT_BYTES

# The frame of the workload's last put (task "d", sequence 4), byte for byte.
LAST_FRAME = len(
    encode_frame(
        {
            "seq": 4,
            "tasks": [
                {
                    "available_at": 0,
                    "key": "d",
                    "max_attempts": 3,
                    "payload": {"n": 4},
                    "task_id": "d",
                }
            ],
            "type": "put",
        }
    )
)


SEED = LAYOUTS[0]
PREALLOCATED = LAYOUTS[1]
each_layout = pytest.mark.parametrize("layout", LAYOUTS, ids=str)
#: Each format writing its own segments, and the preallocated reader reading appended ones.
each_layout_and_shape = pytest.mark.parametrize(
    ("layout", "shape"),
    [(SEED, "appended"), (PREALLOCATED, "preallocated"), (PREALLOCATED, "appended")],
    ids=["seed", "preallocated", "preallocated-reading-appended"],
)


def build(directory: Path, *, compact: bool, layout: Layout = SEED) -> None:
    with layout.open(directory) as queue:
        queue.put("a", {"n": 1})
        queue.put("b", {"n": 2})
        if compact:
            queue.compact()
        queue.put("c", {"n": 3})
        queue.put("d", {"n": 4})


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("wal-*.log"))


@each_layout_and_shape
def test_every_prefix_of_the_final_frame_is_a_recoverable_torn_tail(
    tmp_path: Path, layout: Layout, shape: str
) -> None:
    """The seed's format cuts the torn bytes off the file; the preallocated one overwrites
    them with zeros inside its segment (and reads an appending writer's segment too)."""
    pristine = tmp_path / "pristine"
    build(pristine, compact=False, layout=layout)
    [segment] = segments(pristine)
    data = layout.frames_of(segment)
    start = len(data) - LAST_FRAME
    for cut in range(start, len(data)):
        directory = tmp_path / f"cut-{cut}"
        shutil.copytree(pristine, directory)
        torn = directory / segment.name
        torn.write_bytes(preallocated(data[:cut]) if shape == "preallocated" else data[:cut])
        size = torn.stat().st_size
        with layout.open(directory) as queue:
            assert queue.task_ids() == ["a", "b", "c"], cut
            assert layout.frames_of(torn) == data[:start]
            assert torn.stat().st_size == (size if layout.preallocate else start)
            queue.put("e", {"n": 5})
        with layout.open(directory) as queue:
            assert queue.task_ids() == ["a", "b", "c", "e"]
            assert queue.stats()["last_seq"] == 4


def sequences(segment: Path, *, zero_tail: bool = False) -> list[int]:
    frames, _ = decode_frames(
        segment.read_bytes(), where=segment.name, tail_may_tear=False, zero_tail=zero_tail
    )
    return [frame["seq"] for frame in frames]


def test_by_default_a_segment_is_created_empty_and_holds_nothing_but_frames(
    tmp_path: Path,
) -> None:
    """The seed's format: a reader that knows only frames reads every byte of it."""
    directory = tmp_path / "q"
    with Queue(directory):
        [segment] = segments(directory)
        assert segment.read_bytes() == b""
    build(directory, compact=False)
    data = segment.read_bytes()
    frames, covered = decode_frames(data, where=segment.name, tail_may_tear=False)
    assert covered == len(data)
    assert [frame["seq"] for frame in frames] == [1, 2, 3, 4]


def test_a_preallocated_segment_is_created_full_of_zeros_and_frames_overwrite_them(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "q"
    with PREALLOCATED.open(directory):
        [segment] = segments(directory)
        assert segment.read_bytes() == bytes(SEGMENT_BYTES)
    build(directory, compact=False, layout=PREALLOCATED)
    assert segment.stat().st_size == SEGMENT_BYTES
    assert sequences(segment, zero_tail=True) == [1, 2, 3, 4]
    assert len(PREALLOCATED.frames_of(segment)) < SEGMENT_BYTES
    # The seed's reader rejects it: zeros are no frame.
    with pytest.raises(CorruptStore, match="zeros from byte"):
        sequences(segment)


def test_a_preallocated_directory_opened_in_the_seed_format_is_refused_unchanged(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "q"
    big = {"blob": "x" * (SEGMENT_BYTES // 3)}
    with PREALLOCATED.open(directory) as queue:
        for n in range(4):
            queue.put(f"t{n}", big)
    before = {path.name: path.read_bytes() for path in sorted(directory.iterdir())}
    with pytest.raises(CorruptStore, match="zeros from byte"):
        Queue(directory)
    after = {path.name: path.read_bytes() for path in sorted(directory.iterdir())}
    assert after == before
    with PREALLOCATED.open(directory) as queue:
        assert queue.task_ids() == ["t0", "t1", "t2", "t3"]


@each_layout
def test_a_transaction_that_does_not_fit_starts_the_next_segment(
    tmp_path: Path, layout: Layout
) -> None:
    directory = tmp_path / "q"
    big = {"blob": "x" * (SEGMENT_BYTES // 3)}
    with layout.open(directory) as queue:
        for n in range(4):
            queue.put(f"t{n}", big)
    files = segments(directory)
    zero_tail = layout.preallocate
    assert [sequences(path, zero_tail=zero_tail) for path in files] == [[1, 2], [3, 4]]
    sizes = [path.stat().st_size for path in files]
    if layout.preallocate:
        assert sizes == [SEGMENT_BYTES, SEGMENT_BYTES]
    else:
        assert all(size < SEGMENT_BYTES for size in sizes)
    # One transaction larger than a segment goes in alone, past the segment size.
    with layout.open(directory) as queue:
        queue.put("huge", {"blob": "y" * SEGMENT_BYTES})
    files = segments(directory)
    assert len(files) == 3
    assert files[-1].stat().st_size > SEGMENT_BYTES
    assert sequences(files[-1], zero_tail=zero_tail) == [5]
    with layout.open(directory) as queue:
        assert queue.task_ids() == ["huge", "t0", "t1", "t2", "t3"]


@pytest.mark.parametrize("newest", [True, False])
def test_bytes_in_the_zero_tail_are_a_torn_tail_only_in_the_newest_segment(
    tmp_path: Path, newest: bool
) -> None:
    directory = tmp_path / "q"
    build(directory, compact=False, layout=PREALLOCATED)
    [segment] = segments(directory)
    frames = PREALLOCATED.frames_of(segment)
    data = bytearray(preallocated(frames))
    data[len(frames) + 1000] = 0x7F  # a sector of an unsynced frame, kept without its start
    segment.write_bytes(bytes(data))
    if not newest:
        (directory / "wal-00000000000000000005.log").write_bytes(preallocated(b""))
        with pytest.raises(CorruptStore):
            PREALLOCATED.open(directory)
        return
    with PREALLOCATED.open(directory) as queue:
        assert queue.task_ids() == ["a", "b", "c", "d"]
    assert segment.read_bytes() == preallocated(frames)


@pytest.mark.parametrize("newest", [True, False])
def test_zeros_after_the_frames_are_a_torn_tail_only_in_the_newest_segment(
    tmp_path: Path, newest: bool
) -> None:
    """The seed's format: a power cut may keep an append's new size without its bytes."""
    directory = tmp_path / "q"
    build(directory, compact=False)
    [segment] = segments(directory)
    frames = segment.read_bytes()
    segment.write_bytes(frames + bytes(LAST_FRAME))
    if not newest:
        (directory / "wal-00000000000000000005.log").write_bytes(b"")
        with pytest.raises(CorruptStore, match="zeros from byte"):
            Queue(directory)
        return
    with Queue(directory) as queue:
        assert queue.task_ids() == ["a", "b", "c", "d"]
    assert segment.read_bytes() == frames


@pytest.mark.parametrize("target", ["sealed", "non-final", "snapshot", "current"])
def test_flipping_any_byte_is_detected(tmp_path: Path, target: str) -> None:
    pristine = tmp_path / "pristine"
    with Queue(pristine) as queue:
        queue.put("a", {"n": 1})
        queue.put("b", {"n": 2})
        queue.compact()
        queue.put("c", {"n": 3})
        queue.put("d", {"n": 4})
    if target == "sealed":
        # Keep a sealed segment next to the snapshot: rebuild one from the live segment.
        live = segments(pristine)[-1]
        victim_name, data = live.name, live.read_bytes()
        end = len(data) - LAST_FRAME
        span = range(end)
    elif target == "non-final":
        victim_name = segments(pristine)[-1].name
        data = (pristine / victim_name).read_bytes()
        end = len(data) - LAST_FRAME
        span = range(end)
    elif target == "snapshot":
        victim_name = next(pristine.glob("snapshot-*.json")).name
        data = (pristine / victim_name).read_bytes()
        span = range(len(data))
    else:
        victim_name, data = "CURRENT", (pristine / "CURRENT").read_bytes()
        span = range(len(data))
    for offset in span:  # every single byte
        directory = tmp_path / f"flip-{offset}"
        shutil.copytree(pristine, directory)
        damaged = bytearray(data)
        damaged[offset] ^= 0x5A
        (directory / victim_name).write_bytes(bytes(damaged))
        if target == "sealed":
            # A sealed copy whose bytes are damaged, followed by a fresh live segment.
            (directory / "wal-00000000000000000005.log").write_bytes(b"")
        with pytest.raises(CorruptStore):
            Queue(directory)


@each_layout_and_shape
def test_an_incomplete_sealed_segment_is_corrupt(
    tmp_path: Path, layout: Layout, shape: str
) -> None:
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    cut = layout.frames_of(segment)[:-5]
    segment.write_bytes(preallocated(cut) if shape == "preallocated" else cut)
    (directory / "wal-00000000000000000005.log").write_bytes(b"")
    with pytest.raises(CorruptStore):
        layout.open(directory)


def test_a_sequence_gap_is_corrupt(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    build(directory, compact=False)
    (directory / "wal-00000000000000000009.log").write_bytes(
        encode_frame(
            {"seq": 9, "type": "ack", "task_id": "a", "worker": "w", "generation": 1, "now": 0}
        )
    )
    with pytest.raises(CorruptStore):
        Queue(directory)


@each_layout
def test_an_invalid_transaction_is_corrupt(tmp_path: Path, layout: Layout) -> None:
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    ack = {"seq": 5, "type": "ack", "task_id": "a", "worker": "w", "generation": 1, "now": 0}
    segment.write_bytes(layout.segment(layout.frames_of(segment) + encode_frame(ack)))
    with pytest.raises(CorruptStore, match="invalid transaction"):
        layout.open(directory)


def test_an_orphan_snapshot_newer_than_current_is_ignored(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    build(directory, compact=True)
    orphan = directory / "snapshot-00000000000000000099.json"
    orphan.write_bytes(encode_frame({"seq": 99, "state": {"last_seq": 99, "tasks": []}}))
    (directory / "snapshot-00000000000000000100.json.tmp").write_bytes(b"garbage")
    with Queue(directory) as queue:
        assert queue.task_ids() == ["a", "b", "c", "d"]
        assert queue.stats()["snapshot_seq"] == 2


def test_a_missing_referenced_snapshot_is_corrupt_not_a_fallback(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    build(directory, compact=True)
    next(directory.glob("snapshot-*.json")).unlink()
    with pytest.raises(CorruptStore):
        Queue(directory)


@each_layout
def test_a_length_field_beyond_the_bound_is_never_allocated(tmp_path: Path, layout: Layout) -> None:
    """At the tail it is what a power cut leaves (torn); before a valid frame, corruption."""
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    intact = layout.frames_of(segment)
    bogus = (2**31).to_bytes(4, "big") + b"x" * 10
    segment.write_bytes(layout.segment(intact + bogus))
    with layout.open(directory) as queue:
        assert queue.task_ids() == ["a", "b", "c", "d"]
    assert segment.read_bytes() == layout.segment(intact)
    last = intact[-LAST_FRAME:]
    segment.write_bytes(layout.segment(intact[:-LAST_FRAME] + bogus + last))
    with pytest.raises(CorruptStore, match="claims 2147483648 bytes"):
        layout.open(directory)


def test_old_sealed_segments_left_by_a_compaction_do_not_double_apply(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    keep = tmp_path / "kept.log"
    with Queue(directory) as queue:
        queue.put("a", {"n": 1})
        queue.put("b", {"n": 2})
        shutil.copyfile(segments(directory)[0], keep)
        queue.compact()
        queue.put("c", {})
    # As if the deletion after publishing CURRENT never happened.
    shutil.copyfile(keep, directory / "wal-00000000000000000001.log")
    with Queue(directory) as queue:
        assert queue.task_ids() == ["a", "b", "c"]
        assert queue.stats()["last_seq"] == 3


@each_layout
@pytest.mark.parametrize("kept", ["second-half", "zeros"])
def test_a_final_frame_garbled_by_a_power_cut_is_a_torn_tail(
    tmp_path: Path, kept: str, layout: Layout
) -> None:
    """A power cut may persist an unsynced frame's later sectors without its first ones."""
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    frames = layout.frames_of(segment)
    data = bytearray(layout.segment(frames))
    start = len(frames) - LAST_FRAME
    half = start + LAST_FRAME // 2
    if kept == "second-half":
        data[start:half] = bytes(half - start)
    else:
        data[start : len(frames)] = bytes(LAST_FRAME)
    segment.write_bytes(bytes(data))
    with layout.open(directory) as queue:
        assert queue.task_ids() == ["a", "b", "c"]
    assert segment.read_bytes() == layout.segment(frames[:start])


@each_layout
def test_a_whole_final_frame_behind_a_length_beyond_every_bound_is_damage(
    tmp_path: Path, layout: Layout
) -> None:
    """Its body and digest are there, whole: it was written, and its length damaged since."""
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    frames = layout.frames_of(segment)
    data = bytearray(layout.segment(frames))
    start = len(frames) - LAST_FRAME
    data[start : start + 4] = b"\xff\xff\xff\xff"
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match=r"the length field at byte \d+ is damaged"):
        layout.open(directory)
    assert segment.read_bytes() == bytes(data)


@each_layout
def test_a_garbled_frame_followed_by_a_valid_one_is_still_corruption(
    tmp_path: Path, layout: Layout
) -> None:
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    frames = layout.frames_of(segment)
    data = bytearray(layout.segment(frames))
    start = len(frames) - 2 * LAST_FRAME + 1  # inside the frame before the last
    data[start : start + 8] = bytes(8)
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptStore):
        layout.open(directory)


@pytest.mark.parametrize("zeros", [0, 1, 3, 4, 5, 4096])
def test_preallocated_frames_end_where_only_zeros_remain(zeros: int) -> None:
    frame = encode_frame({"seq": 1, "type": "put", "tasks": []})
    decoded = decode_frames(frame + bytes(zeros), where="w", tail_may_tear=False, zero_tail=True)
    assert decoded == ([{"seq": 1, "type": "put", "tasks": []}], len(frame))
    with pytest.raises(CorruptStore, match=r"zero length field|incomplete frame"):
        decode_frames(
            frame + bytes(zeros) + b"\x01", where="w", tail_may_tear=False, zero_tail=True
        )


@pytest.mark.parametrize("zeros", [1, 3, 4, 5, 4096])
def test_in_the_seed_format_zeros_after_the_frames_are_torn_or_corrupt(zeros: int) -> None:
    frame = encode_frame({"seq": 1, "type": "put", "tasks": []})
    decoded = decode_frames(frame + bytes(zeros), where="w", tail_may_tear=True)
    assert decoded == ([{"seq": 1, "type": "put", "tasks": []}], len(frame))
    with pytest.raises(CorruptStore, match=r"zeros from byte|incomplete frame"):
        decode_frames(frame + bytes(zeros), where="w", tail_may_tear=False)


def data_files(directory: Path) -> dict[str, bytes]:
    """Every file a failed open must leave as it found it (all but the owner's LOCK)."""
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())} | {"LOCK": b""}


@each_layout
def test_a_synced_final_frame_with_any_byte_flipped_is_corrupt_and_left_as_it_was(
    tmp_path: Path, layout: Layout
) -> None:
    """Only an unfinished write is a torn tail: a complete final frame whose length, JSON or
    digest was damaged after it was synced is CorruptStore, and the failed open changes no
    byte of the directory (its digest, length field and body, each byte flipped two ways)."""
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    frames = layout.frames_of(segment)
    start = len(frames) - LAST_FRAME
    silent = []
    for offset in range(start, len(frames)):
        for mask in (0x01, 0xFF):
            damaged = bytearray(layout.segment(frames))
            damaged[offset] ^= mask
            segment.write_bytes(bytes(damaged))
            before = data_files(directory)
            try:
                layout.open(directory).close()
                silent.append((offset - start, mask))
            except CorruptStore:
                pass
            assert data_files(directory) == before
    assert silent == []


@each_layout
def test_a_big_final_frame_with_any_byte_flipped_is_corrupt(tmp_path: Path, layout: Layout) -> None:
    directory = tmp_path / "q"
    segment, frames, start = build_big(directory, layout)
    for offset in range(start, len(frames), 7):
        damaged = bytearray(layout.segment(frames))
        damaged[offset] ^= 0xFF
        segment.write_bytes(bytes(damaged))
        with pytest.raises(CorruptStore):
            layout.open(directory)
        assert segment.read_bytes() == bytes(damaged)


@each_layout
def test_a_final_frame_left_unfinished_is_a_torn_tail(tmp_path: Path, layout: Layout) -> None:
    """A sector of the frame still zero (a power cut persists sectors in any order), a frame
    running into the zeros at the end, or a frame cut short: torn, dropped, cut off."""
    pristine = tmp_path / "pristine"
    segment, frames, start = build_big(pristine, layout)
    for name, data in unfinished_shapes(frames, start, layout).items():
        directory = tmp_path / name.replace(" ", "-")
        shutil.copytree(pristine, directory)
        (directory / segment.name).write_bytes(data)
        with layout.open(directory) as queue:
            assert queue.task_ids() == ["a", "b"], name
        assert layout.frames_of(directory / segment.name) == frames[:start], name


@each_layout
def test_an_open_that_fails_cuts_no_torn_tail(tmp_path: Path, layout: Layout) -> None:
    """The torn tail is cut off only once the whole directory has been read and accepted: a
    sequence gap before it leaves every byte where it was."""
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    ack = {"seq": 9, "type": "ack", "task_id": "a", "worker": "w", "generation": 1, "now": 0}
    torn = encode_frame(ack)[:20]
    segment.write_bytes(layout.segment(layout.frames_of(segment) + encode_frame(ack) + torn))
    before = data_files(directory)
    with pytest.raises(CorruptStore, match="sequence 9, expected 5"):
        layout.open(directory)
    assert data_files(directory) == before


@each_layout
def test_a_whole_final_frame_behind_a_zeroed_length_field_is_damage(
    tmp_path: Path, layout: Layout
) -> None:
    """A lost sector zeroes a length field with its body intact only when the body begins
    at the sector boundary; anywhere else the frame was written whole and damaged since."""
    directory = tmp_path / "q"
    build(directory, compact=False, layout=layout)
    [segment] = segments(directory)
    frames = layout.frames_of(segment)
    start = len(frames) - LAST_FRAME
    assert (start + 4) % 512 != 0
    data = bytearray(layout.segment(frames))
    data[start : start + 4] = bytes(4)
    segment.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match=r"the length field at byte \d+ is damaged"):
        layout.open(directory)
    assert segment.read_bytes() == bytes(data)


def test_a_length_field_lost_with_its_sector_before_a_whole_body_is_a_torn_tail(
    tmp_path: Path,
) -> None:
    """The last frame's body begins at a sector boundary: the sector before it, holding the
    length field, was lost while the body's sectors reached the disk."""
    directory = tmp_path / "q"
    directory.mkdir()
    short = len(encode_frame(put_txn(1, "pad", {"text": ""})))
    first = encode_frame(put_txn(1, "pad", {"text": "p" * (508 - short)}))
    assert len(first) == 508
    last = encode_frame(put_txn(2, "q", {"n": 1}))
    segment = directory / "wal-00000000000000000001.log"
    segment.write_bytes(first + bytes(4) + last[4:])
    with Queue(directory) as queue:
        assert queue.task_ids() == ["pad"]
    assert segment.read_bytes() == first


def test_in_the_seed_format_a_final_frame_ends_in_lost_zeros_only_from_a_sector(
    tmp_path: Path,
) -> None:
    """Without preallocation zeros at the end of a complete-length frame are a new size kept
    without its data, lost in whole sectors: the last digest byte damaged into a zero is
    corruption, zeros from a sector boundary a torn tail."""
    directory = tmp_path / "q"
    directory.mkdir()
    last = encode_frame(put_txn(2, "q", {"n": 1}))
    short = len(encode_frame(put_txn(1, "pad", {"text": ""})))
    first = encode_frame(put_txn(1, "pad", {"text": "p" * (1024 + 10 - len(last) - short)}))
    frames = first + last
    assert len(frames) == 1024 + 10  # the last sector holds the digest's last 10 bytes
    segment = directory / "wal-00000000000000000001.log"
    for name, zeroed in {"the last byte": 1, "a byte short of the sector": 9}.items():
        segment.write_bytes(frames[:-zeroed] + bytes(zeroed))
        with pytest.raises(CorruptStore, match="checksum mismatch"):
            Queue(directory)
        assert segment.read_bytes() == frames[:-zeroed] + bytes(zeroed), name
    segment.write_bytes(frames[:1024] + bytes(10))
    with Queue(directory) as queue:
        assert queue.task_ids() == ["pad"]
    assert segment.read_bytes() == first
