#!/usr/bin/env python3
"""flowrl's transformer against PyTorch's on this machine, measured in one run: the Rust bench
(`cargo bench --bench transformer`, criterion) and `transformer_torch.py` alternate `--rounds`
times, each on `--threads` threads, and the table of `docs/PERFORMANCE.md` is printed with the
ratio PyTorch time / flowrl time (above 1: flowrl is faster).

    python benches/reference/compare_transformer.py --rounds 3 --threads 2 [--only forward/32]

Build the bench first (`cargo bench --bench transformer --no-run`) so no round pays for a
compilation, and leave the machine otherwise idle. Each cell is the range of the per-round
medians; the ratio is that of the medians over rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rust_round(threads, only):
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    # the PyTorch side is one backend: compare Flex's rows (the bench has NdArray's too)
    cmd = ["cargo", "bench", "--bench", "transformer", "--", "--noplot", only or "/flex/"]
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    out = {}
    for bench in (ROOT / "target" / "criterion").rglob("new/benchmark.json"):
        full_id = json.loads(bench.read_text())["full_id"]
        if (only or "/flex/") not in full_id:
            continue
        est = json.loads((bench.parent / "estimates.json").read_text())
        out[full_id] = est["median"]["point_estimate"] / 1e6
    return out


def torch_round(threads, only):
    cmd = [
        sys.executable,
        str(ROOT / "benches" / "reference" / "transformer_torch.py"),
        "--threads",
        str(threads),
        "--only",
        only,
    ]
    res = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    out = {}
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            out[r["id"]] = r["median_ms"]
    return out


def span(xs):
    lo, hi = min(xs), max(xs)
    return f"{lo:.0f} ms" if round(lo) == round(hi) else f"{lo:.0f}-{hi:.0f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    rust, torch = {}, {}
    for r in range(args.rounds):
        for name, ms in rust_round(args.threads, args.only).items():
            rust.setdefault(name, []).append(ms)
        for name, ms in torch_round(args.threads, args.only).items():
            torch.setdefault(name, []).append(ms)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print("| bench | flowrl | PyTorch | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name in sorted(set(rust) & set(torch)):
        ratio = statistics.median(torch[name]) / statistics.median(rust[name])
        print(f"| `{name}` | {span(rust[name])} | {span(torch[name])} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
