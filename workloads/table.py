"""The paper's table from an observations CSV: per combination and job, the mean
percent change of E, T, S, V, R and W against the job's solo profile, and its
interference rate.

    python -m workloads.table observations.csv [--markdown table.md] [--csv table.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from events import PARAMETERS

VALUE_COLUMNS = (*(f"{p}_pct" for p in PARAMETERS), "interference_pct")
TABLE_COLUMNS = ("combination", "job_type", "windows", *VALUE_COLUMNS)


def _number(text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    x = float(text)
    return x if math.isfinite(x) else None


def read_rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def paper_table(rows: Iterable[Mapping[str, str]]) -> list[dict[str, Any]]:
    """Mean of each value column per (combination, job type), in order of combination size, then name.

    >>> rows = [{"group": "a + b", "job_type": "a", "E_pct": "10", "interference_pct": "20"},
    ...         {"group": "a + b", "job_type": "a", "E_pct": "30", "interference_pct": ""}]
    >>> t = paper_table(rows)[0]
    >>> t["combination"], t["windows"], t["E_pct"], t["interference_pct"], t["T_pct"]
    ('a + b', 2, 20.0, 20.0, None)
    """
    cells: dict[tuple[str, str], dict[str, list[float]]] = {}
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r.get("group") or "", r.get("job_type") or "")
        counts[key] = counts.get(key, 0) + 1
        entry = cells.setdefault(key, {c: [] for c in VALUE_COLUMNS})
        for c in VALUE_COLUMNS:
            v = _number(r.get(c))
            if v is not None:
                entry[c].append(v)
    out = []
    for (group, job), entry in sorted(cells.items(), key=lambda kv: (kv[0][0].count("+"), kv[0])):
        line: dict[str, Any] = {"combination": group, "job_type": job, "windows": counts[(group, job)]}
        for c in VALUE_COLUMNS:
            line[c] = statistics.fmean(entry[c]) if entry[c] else None
        out.append(line)
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "–"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def to_markdown(table: Sequence[Mapping[str, Any]]) -> str:
    """A Markdown table: one line per (combination, job); ``–`` where a value is unknown."""
    head = ["combination", "job", "windows", *(f"{p} %" for p in PARAMETERS), "interference %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in table:
        lines.append("| " + " | ".join(_fmt(t[c]) for c in TABLE_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def write_csv(table: Sequence[Mapping[str, Any]], path: str | Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(TABLE_COLUMNS)
        for t in table:
            w.writerow(["" if t[c] is None else (f"{t[c]:.4g}" if isinstance(t[c], float) else t[c]) for c in TABLE_COLUMNS])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m workloads.table", description=__doc__.split("\n\n")[0])
    p.add_argument("csv", help="observations CSV written by `aip experiment`")
    p.add_argument("--markdown", help="write the Markdown table here (default: print it)")
    p.add_argument("--csv-out", help="also write the table as CSV here")
    args = p.parse_args(argv)
    try:
        table = paper_table(read_rows(args.csv))
    except (OSError, ValueError, csv.Error) as exc:
        print(f"workloads.table: error: cannot read {args.csv}: {exc}", file=sys.stderr)
        return 2
    md = to_markdown(table)
    if args.markdown:
        Path(args.markdown).write_text(md)
    else:
        sys.stdout.write(md)
    if args.csv_out:
        write_csv(table, args.csv_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
