#!/usr/bin/env python3
"""The most sampled instructions of one kernel in Nsight Compute's source page, exported as CSV.

Usage: ncu -i REPORT --page source --csv --print-source sass > F.csv; python3 tools/bench/ncu_hot.py F.csv [N]

Prints the N instructions (default 30) with the most warp-stall samples, each with its share of all samples, its
SASS and the stall reasons that make up most of its samples (the columns ncu names after the reasons, where the
report has them), then the samples summed by opcode. The column names differ between ncu versions, so they are
matched loosely: the instruction text ("Source"), the samples ("Warp Stall Sampling (All Samples)") and any other
column with "stall" in its name.
"""
import csv
import sys
from collections import Counter


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: ncu_hot.py SOURCE_PAGE.csv [N]: the CSV of `ncu -i R --page source --csv --print-source sass`")
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(sys.argv[1], newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not quoted
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"{sys.argv[1]}: no CSV rows (did ncu write the source page? see the file's text)")
    head, body = rows[0], rows[1:]
    col = {name: i for i, name in enumerate(head)}
    source = next((i for name, i in col.items() if name.strip().lower() == "source"), None)
    samples = next((i for name, i in col.items() if "sampling (all" in name.lower()), None)
    if source is None or samples is None:
        sys.exit(f"{sys.argv[1]}: no Source or 'Warp Stall Sampling (All Samples)' column; the columns: {head}")
    reasons = [i for name, i in col.items() if "stall" in name.lower() and i != samples and "sampling" not in name.lower()]
    total = sum(number(r[samples]) for r in body if len(r) > samples) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples")
    hot = sorted((r for r in body if len(r) > samples), key=lambda r: -number(r[samples]))[:top]
    for r in hot:
        parts = sorted(((number(r[i]), head[i]) for i in reasons if number(r[i]) > 0), reverse=True)[:3]
        why = ", ".join(f"{name} {value:.0f}" for value, name in parts)
        print(f"{100 * number(r[samples]) / total:5.1f}%  {r[source].strip()[:70]:70s}  {why}")
    by_op = Counter()
    for r in body:
        if len(r) > samples and r[source].strip():
            op = r[source].split()[0] if not r[source].strip().startswith("@") else r[source].split()[1]
            by_op[op.split(".")[0]] += number(r[samples])
    print("by opcode: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(12)))


if __name__ == "__main__":
    main()
