#!/usr/bin/env python3
"""The table of a `full_size_gpu.sh` run: for every measurement, flowrl's and PyTorch's median
step time, their ratio (PyTorch time / flowrl time, above 1 means flowrl is faster) and the
peak device memory in use during the measurement (NVML's `used`, sampled every 50 ms: the
whole process's memory, pools and CUDA context included, so the two sides are read the same
way).

    python benches/reference/full_size_report.py OUT
"""

import json
import sys
from pathlib import Path


def key(r):
    if r["part"] == "transformer":
        return (r["part"], r["phase"], r["dtype"], r["resolution"], r.get("checkpointing", ""))
    return (r["part"], r["phase"], r["dtype"], r["prompts"], "")


def label(k):
    part, phase, dtype, size, ckpt = k
    if part == "transformer":
        what = f"transformer {phase.replace('_', ' ')}, {size}x{size}"
        if ckpt:
            what += ", checkpointing " + ("per block" if ckpt == "PerBlock" else "none")
    else:
        what = f"text encoder forward, {size} prompts"
    return f"{what} ({dtype.lower()})"


def main():
    out = Path(sys.argv[1])
    samples = []
    mem = out / "memory.tsv"
    if mem.exists():
        for line in mem.read_text().splitlines():
            t, m = line.split("\t")
            samples.append((int(t), int(m)))
    rows = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if r.get("size") != "Full":
            continue
        peak = None
        if "start_ms" in r:
            inside = [m for t, m in samples if r["start_ms"] <= t <= r["end_ms"]]
            peak = max(inside) if inside else None
        rows.setdefault(key(r), {})[r.get("impl", "flowrl")] = (r, peak)
    print("| what | flowrl | PyTorch | ratio | flowrl peak memory | PyTorch peak memory |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")

    def cell(entry):
        if entry is None:
            return "-", "-"
        r, peak = entry
        if "median_ms" not in r:
            return "failed", "-"
        first = f" (first {r['first_ms'] / 1e3:.1f} s)"
        mem = f"{peak / 1024:.1f} GiB" if peak is not None else "-"
        return f"{r['median_ms']:.0f} ms{first}", mem

    for k, sides in rows.items():
        f, fm = cell(sides.get("flowrl"))
        t, tm = cell(sides.get("torch"))
        ratio = "-"
        a, b = sides.get("flowrl"), sides.get("torch")
        if a and b and "median_ms" in a[0] and "median_ms" in b[0]:
            ratio = f"{b[0]['median_ms'] / a[0]['median_ms']:.2f}"
        print(f"| {label(k)} | {f} | {t} | {ratio} | {fm} | {tm} |")


if __name__ == "__main__":
    main()
