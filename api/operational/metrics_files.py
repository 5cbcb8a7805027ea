"""The workers' Prometheus multiprocess files: dead workers' merged away, read at most once
per `CACHE_S`.

prometheus-client's multiprocess mode writes one file per process and metric type
(`counter_<pid>.db`, `histogram_<pid>.db`, `gauge_livesum_<pid>.db`, ...) and a scrape
reads and merges every file in the directory. A worker that exits leaves its counter and
histogram files behind (their counts must survive it: a counter that dropped would read as a
reset), so every restart made each scrape longer. Before each read, the files of processes
that are gone are folded into one archive file per type (`counter_archive.db`: the same
keys, values added) and removed; the live gauges of a dead worker (`livesum`, `livemax`) are
removed as `prometheus_client.multiprocess.mark_process_dead` does (gunicorn's `child_exit`
does it too). Only this process writes the archive, between two reads, so no scrape sees a
count twice or not at all.

A scrape costs one read of the files at most every `CACHE_S`; the scrapes in between are
answered from that read.
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path
from typing import Final

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.mmap_dict import MmapedDict

from api.request.admission.in_flight import process_alive

__all__ = ["CACHE_S", "MetricsFiles", "merge_dead"]

#: How long one read of the files answers scrapes, seconds (Prometheus scrapes every 15-60 s).
CACHE_S: Final = 1.0
_ARCHIVE: Final = "archive"
_SUMMED_TYPES: Final = ("counter", "histogram", "summary")


def merge_dead(path: str) -> int:
    """Fold the files of dead processes in `path` into the archives; the files folded.

    Counters, histograms and summaries are added into `<type>_archive.db`; gauges of a dead
    process are removed (the API's gauges are all `live*` modes: a dead worker has none).
    """
    folded = 0
    for file in glob.glob(os.path.join(path, "*.db")):
        parts = os.path.basename(file)[: -len(".db")].split("_")
        pid_text = parts[-1]
        if not pid_text.isdigit() or process_alive(int(pid_text)):
            continue
        typ = parts[0]
        if typ in _SUMMED_TYPES:
            _add_into(os.path.join(path, f"{typ}_{_ARCHIVE}.db"), file)
        os.unlink(file)
        folded += 1
    return folded


# prometheus-client's file format is unannotated upstream: its calls are untyped.
def _add_into(archive_path: str, file: str) -> None:
    """Add every value of `file` into the same key of `archive_path` (made if missing)."""
    archive = MmapedDict(archive_path)  # type: ignore[no-untyped-call]
    try:
        for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(file):  # type: ignore[no-untyped-call]
            archive.write_value(key, archive.read_value(key)[0] + value, timestamp)  # type: ignore[no-untyped-call]
    finally:
        archive.close()  # type: ignore[no-untyped-call]


class MetricsFiles:
    """The text exposition of every process's metrics in `path`, read at most once per
    `cache_s` (monotonic seconds).

    Args:
        path: the multiprocess directory (`PROMETHEUS_MULTIPROC_DIR`).
        cache_s: how long one read answers scrapes, seconds.
    """

    def __init__(self, path: str | Path, cache_s: float = CACHE_S) -> None:
        self.path = str(path)
        self.cache_s = cache_s
        self.reads = 0
        self._body = b""
        self._read_at = float("-inf")

    def exposition(self, now: float | None = None) -> tuple[bytes, str]:
        """(the text exposition, its content type)."""
        now = time.monotonic() if now is None else now
        if now - self._read_at >= self.cache_s:
            merge_dead(self.path)
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.path)  # type: ignore[no-untyped-call]  # unannotated upstream
            self._body = generate_latest(registry)
            self._read_at = now
            self.reads += 1
        return self._body, CONTENT_TYPE_LATEST
