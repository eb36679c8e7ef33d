#!/usr/bin/python3
"""Puts a benchmark's report into docs/BENCHMARKS.md (or $DOC), replacing what stands between
<!-- MARKER:begin --> and <!-- MARKER:end -->. With a COMMAND, the report is headed by today's
date and that command, so every table says what produced it.

    bench/write_docs.py MARKER REPORT_FILE [COMMAND]
"""
import datetime
import os
import sys

if len(sys.argv) not in (3, 4):
    sys.exit(__doc__)
marker, report = sys.argv[1], sys.argv[2]
doc = os.environ.get("DOC", "docs/BENCHMARKS.md")
text, new = open(doc).read(), open(report).read().strip()
if len(sys.argv) == 4:
    new = f"{datetime.date.today()}, `{sys.argv[3].strip()}`:\n\n{new}"
begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
if begin not in text or end not in text:
    sys.exit(f"{doc}: markers {begin} / {end} not found; add them where the tables go")
head, rest = text.split(begin, 1)
open(doc, "w").write(head + begin + "\n" + new + "\n" + end + rest.split(end, 1)[1])
print(f"wrote the {marker} into {doc}", file=sys.stderr)
