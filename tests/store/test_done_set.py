"""The done-set at resume: parts with a verified record are read by their ids only (their
counters are the record's); the result equals reading every row, a sample stored twice is
counted once, and a record that disagrees with its part is damage."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from regen.plan.attempts import RetryFlagged, select
from regen.store import RunDir, layout
from regen.store.completed import CompletedSample
from regen.store.counts import SourceCounts
from regen.store.doneset import read_done
from regen.store.parts import inspect_part, list_parts, make_record, part_bytes
from regen.store.segments import Journal


def to_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows)


def done_sample(source: str, i: int, turns: int, finish: str = "stop") -> CompletedSample:
    sid = f"{source}:{i}"
    rows = [{"sample_id": sid, "source": source, "turn": t, "prompt_tokens": 7 + i,
             "completion_tokens": 3 * t + i, "finish_reason": finish if t == turns - 1 else "stop"}
            for t in range(turns)]  # fmt: skip
    return CompletedSample(sid, source, rows)


def slow_done_set(rd: RunDir) -> tuple[set[str], dict[str, SourceCounts]]:
    """Every row read (the check a part without a record gets)."""
    ids: set[str] = set()
    sums: dict[str, SourceCounts] = {}
    for st in list_parts(rd):
        st.record = None
        assert inspect_part(rd, st) == ""
        for sid, (source, c) in st.samples.items():
            if sid not in ids:
                ids.add(sid)
                sums.setdefault(source, SourceCounts()).add(c)
    return ids, sums


def test_the_record_path_equals_reading_every_row(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S", to_table)
    for i in range(40):
        j.append(done_sample("a" if i % 3 else "b", i, 1 + i % 3, "length" if i % 7 == 0 else ""))
        if i % 9 == 8:
            j.roll()
    j.close()
    done = read_done(rd)
    ids, sums = slow_done_set(rd)
    assert done.ids == ids and done.sources == sums and done.parts == 5 and not done.damaged


def test_a_sample_stored_twice_is_counted_once(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S", to_table)
    for i in range(5):
        j.append(done_sample("a", i, 2))
    j.roll()
    for i in (3, 4, 5):  # 3 and 4 again (a bug or a hand-made directory)
        j.append(done_sample("a", i, 2))
    j.close()
    done = read_done(rd)
    assert done.ids == {f"a:{i}" for i in range(6)}
    assert done.sources["a"].done == 6 and done.sources["a"].rows == 12


def test_a_record_that_disagrees_with_its_part_is_damage(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rows = [r for i in range(4) for r in done_sample("a", i, 2).rows]
    data = part_bytes(to_table(rows), 4)
    rd.write_bytes_atomic(layout.part_path("S-00000"), data)
    counts = {f"a:{i}": ("a", SourceCounts(done=1, rows=n)) for i, n in enumerate((2, 2, 4))}
    rec = make_record("S-00000", data, counts, 8)  # 8 rows in 3 samples; the part holds 4
    layout.part_record_file("S-00000").write(rd, rec)
    done = read_done(rd, repair=True)
    assert done.ids == set() and len(done.damaged) == 1
    assert "4 samples, its record says 3" in done.damaged[0]
    assert rd.exists(layout.quarantine_path(layout.part_path("S-00000")))


def test_a_part_without_record_is_read_whole_and_gets_one(tmp_path: Path) -> None:
    rd = RunDir.open(tmp_path / "run")
    rows = [r for i in range(3) for r in done_sample("a", i, 2).rows]
    rd.makedirs(layout.PARTS_DIR)
    pq.write_table(to_table(rows), rd.path(layout.part_path("old")))
    done = read_done(rd, repair=True)
    assert done.ids == {"a:0", "a:1", "a:2"} and done.sources["a"].rows == 6
    again = read_done(rd)  # now through its record
    assert again.ids == done.ids and again.sources == done.sources


def flagged_run(tmp_path: Path) -> RunDir:
    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S", to_table)
    for i in range(12):
        s = done_sample("a", i, 2)
        for r in s.rows:
            r["attempt"], r["quality_flags"] = 0, ["repetition"] if i % 4 == 0 else []
        j.append(s)
        if i % 5 == 4:
            j.roll()
    j.close()
    return rd


def test_ids_alone_count_flagged_answers_but_do_not_name_them(tmp_path: Path) -> None:
    rd = flagged_run(tmp_path)
    fast, full = read_done(rd), read_done(rd, answers=True)
    assert fast.ids == full.ids and fast.sources == full.sources and fast.parts == full.parts == 3
    assert fast.sources["a"].flagged == 3 and fast.sources["a"].flags == {"repetition": 6}  # rows
    assert not fast.answers and fast.flagged == {}  # unknown, so select refuses it
    assert select(full, RetryFlagged(("repetition",))) == {"a:0": 1, "a:4": 1, "a:8": 1}
    try:
        select(fast, RetryFlagged(("repetition",)))
    except ValueError as e:
        assert "without its answers" in str(e)
    else:
        raise AssertionError("select took a done-set read without its answers")


def test_a_run_with_new_attempts_is_read_whole(tmp_path: Path) -> None:
    rd = flagged_run(tmp_path)
    before = read_done(rd, answers=True)
    j = Journal(rd, "T", to_table)
    again = done_sample("a", 0, 2)
    for r in again.rows:
        r["attempt"], r["quality_flags"] = 1, []
    j.append(CompletedSample("a:0", "a", again.rows, before.flagged["a:0"].to_counts()))
    j.close()
    done = read_done(rd)  # a part holds a new attempt: every part's rows are read
    assert done.answers and done.attempts == {"a:0": 1} and set(done.flagged) == {"a:4", "a:8"}
    a = done.sources["a"]
    assert (a.done, a.flagged, a.retried) == (12, 2, 1)


def _native_run(tmp_path: Path, n: int = 12, per_part: int = 4) -> RunDir:
    """Parts of real rows (regen.store.schema.SCHEMA: native rows) with their records."""
    from regen.core.sample import Sample
    from regen.engine.rows import native_row

    rd = RunDir.open(tmp_path / "run")
    j = Journal(rd, "S")
    for i in range(n):
        s = Sample(f"k:{i}", "k", [], mode="native", input_ids=list(range(5 + i)),
                   loss_mask=[0, 0] + [1] * (3 + i))  # fmt: skip
        j.append(CompletedSample(s.id, "k", [native_row(s)]))
        if (i + 1) % per_part == 0:
            j.roll()
    return rd


def test_a_damaged_record_never_costs_its_intact_part(tmp_path: Path) -> None:
    """Garbage in a part's record: the part proves itself intact (footer counts, page CRCs),
    stays, and gets its record back; the damaged record goes to quarantine/."""
    rd = _native_run(tmp_path)
    want = read_done(rd)
    st = list_parts(rd)[1]
    rec = layout.part_record_path(st.stem)
    before = layout.part_record_file(st.stem).read(rd)
    rd.write_bytes_atomic(rec, b'{"stem": "x", "rows": 4, "sam')
    seen = read_done(rd)  # a status view, a verify: nothing written
    assert seen.ids == want.ids and seen.sources == want.sources and not seen.damaged
    done = read_done(rd, repair=True)  # a resume
    assert done.ids == want.ids and not done.damaged and done.records_rebuilt == [rec]
    assert rd.exists(st.part) and rd.list(layout.QUARANTINE_DIR) == [
        layout.quarantine_path(rec).split("/")[-1]
    ]
    got = layout.part_record_file(st.stem).read(rd)
    assert got is not None and before is not None
    assert got.model_dump(exclude={"written_at"}) == before.model_dump(exclude={"written_at"})


def test_without_a_record_a_part_with_changed_pages_is_damage(tmp_path: Path) -> None:
    """The part's own checks are real: same-size garbage in a data page is found by its CRC
    when there is no record to compare the bytes with."""
    rd = _native_run(tmp_path)
    st = list_parts(rd)[0]
    rd.delete(layout.part_record_path(st.stem))
    path = Path(rd.path(st.part))
    data = bytearray(path.read_bytes())
    pf = pq.ParquetFile(path)
    col = pf.metadata.row_group(0).column(pf.schema_arrow.names.index("input_ids"))
    at = col.data_page_offset + (col.total_compressed_size // 2)
    data[at : at + 8] = b"\xde\xad\xbe\xef" * 2
    path.write_bytes(bytes(data))
    done = read_done(rd, repair=True)
    assert len(done.damaged) == 1 and st.part in done.damaged[0]
    assert not rd.exists(st.part) and done.ids == {f"k:{i}" for i in range(4, 12)}
