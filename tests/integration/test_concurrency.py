"""Concurrency: many writers (threads) recording into one journal at once, and many threads importing
at once in one traced process."""

from __future__ import annotations

import itertools
import json
import subprocess
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from run_spans import spans_of

from starttrace.sources.journal_files import journal_files, journal_lines
from starttrace.sources.journal_reader import read_run

WRITERS = 16
LINES_PER_WRITER = 400

# One process, 16 writer threads, one journal with small segments: the threads race for room in
# a segment and for opening the next one. (Processes never share a journal: each has its own.)
WRITER = textwrap.dedent(
    """
    import random, sys, threading
    from starttrace.tracer.journal import JournalWriter, encode

    base, writers, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    journal = JournalWriter(base, first_size=64 * 1024)
    go = threading.Barrier(writers)
    sys.setswitchinterval(1e-5)  # switch threads as often as possible

    def work(writer_id):
        rng = random.Random(writer_id)
        go.wait()  # all writers start together
        for i in range(count):
            size = rng.randint(10, 4000)
            head = encode({"w": writer_id, "i": i, "pad": ""})
            pad = ("é" if i % 3 == 0 else "x") * max(0, (size - len(head)) // 2)
            line = encode({"w": writer_id, "i": i, "pad": pad}) + "\\n"
            assert journal.write(line), journal.failed

    threads = [threading.Thread(target=work, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    journal.close()
    print(journal.number + 1)
    """
)


def test_writers_append_whole_lines_to_one_journal(
    venv_python: str, tmp_path: Path, clean_env: Callable[..., dict[str, str]]
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    proc = subprocess.run(
        [venv_python, str(script), str(tmp_path / "shared"), str(WRITERS), str(LINES_PER_WRITER)],
        env=clean_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) >= 6, "the writers filled many segments"
    (journal,) = journal_files(tmp_path)
    raw_lines = journal_lines(journal)
    assert raw_lines[-1] == b"", "the journal ends with a whole record"
    lines = raw_lines[:-1]
    assert len(lines) == WRITERS * LINES_PER_WRITER
    sizes = [len(line) + 1 for line in lines]
    assert min(sizes) >= 10 and max(sizes) <= 4100
    assert max(sizes) > 3000, "long lines were written"
    seen: dict[int, list[int]] = {}
    for number, line in enumerate(lines, 1):
        record = json.loads(line)  # every line parses: no torn or interleaved writes
        seen.setdefault(record["w"], []).append(record["i"])
        assert set(record["pad"]) <= {"x", "é"}, number
    assert Counter({w: len(v) for w, v in seen.items()}) == Counter(dict.fromkeys(range(WRITERS), LINES_PER_WRITER))
    for indexes in seen.values():
        assert indexes == list(range(LINES_PER_WRITER)), "each writer's lines stay in its own order"
    # the writers really interleaved (they ran concurrently)
    switches = sum(1 for a, b in itertools.pairwise(lines) if json.loads(a)["w"] != json.loads(b)["w"])
    assert switches > WRITERS


THREADS = 16

THREADED = textwrap.dedent(
    """
    import sys, threading
    barrier = threading.Barrier(%d)

    def work(i):
        barrier.wait()
        __import__("thr_outer_%%d" %% i)

    threads = [threading.Thread(target=work, args=(i,), name="importer-%%d" %% i) for i in range(%d)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("done")
    """
) % (THREADS, THREADS)


def test_threads_import_concurrently_with_per_thread_nesting(
    venv_python: str, tmp_path: Path, traced_env: dict[str, str], journal_root: Path,
    only_run_dir: Callable[[Path], Path],
) -> None:  # fmt: skip
    mods = tmp_path / "mods"
    mods.mkdir()
    for i in range(THREADS):
        (mods / f"thr_outer_{i}.py").write_text(
            f"import time\ntime.sleep(0.02)\nimport thr_inner_{i}\ntime.sleep(0.02)\n"
        )
        (mods / f"thr_inner_{i}.py").write_text(f"import time\ntime.sleep(0.03)\nimport thr_leaf_{i}\n")
        (mods / f"thr_leaf_{i}.py").write_text("import time\ntime.sleep(0.01)\n")
    env = dict(traced_env, PYTHONPATH=str(mods))
    proc = subprocess.run([venv_python, "-c", THREADED], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stderr
    run = read_run(only_run_dir(journal_root))
    assert run.problems == []
    (process,) = run.processes
    own = spans_of(run, process)
    spans = {s.span_id: s for s in own}
    ours = {s.attrs["starttrace.import.module"]: s for s in own if str(s.name).startswith("import thr_")}
    assert len(ours) == 3 * THREADS
    threads = {ours[f"thr_outer_{i}"].thread for i in range(THREADS)}
    assert None not in threads and len(threads) == THREADS, "each importer thread is its own lane"
    for i in range(THREADS):
        outer, inner, leaf = ours[f"thr_outer_{i}"], ours[f"thr_inner_{i}"], ours[f"thr_leaf_{i}"]
        assert outer.parent_id == process.process_span_id
        assert inner.parent_id == outer.span_id and leaf.parent_id == inner.span_id
        assert outer.thread == inner.thread == leaf.thread
    # every import span's parent is an import on the same thread (or the process span), and lies around it
    for span in own:
        if span.attrs.get("starttrace.phase") != "import":
            continue
        parent = spans.get(span.parent_id or "")
        if parent is None or parent.attrs.get("starttrace.phase") != "import":
            continue
        assert parent.thread == span.thread, (span.name, parent.name)
        assert parent.start_ns <= span.start_ns and span.end_ns <= parent.end_ns, (span.name, parent.name)
    # the imports really overlapped in time
    starts = sorted(ours[f"thr_outer_{i}"].start_ns for i in range(THREADS))
    ends = sorted(ours[f"thr_outer_{i}"].end_ns for i in range(THREADS))
    assert starts[-1] < ends[0], "all 16 outer imports were in flight at the same moment"
