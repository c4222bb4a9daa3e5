#!/usr/bin/env python3
"""A/B of top-k variants phase by phase: builds bench/topk_phases.cu against
each template tree (nvcc, sm_90a), runs every shape for every variant in
alternating rounds, and prints one markdown table of the phases' spans
(CTA 0's microseconds, median of the runs) and the kernel's time.

    python3 bench/topk_phases_ab.py NAME=TEMPLATES_DIR [NAME=DIR ...]
        [--shapes "1 131072 cluster,16 32768 one"] [--rounds 2] [--runs 40]

TEMPLATES_DIR is a whole template tree (the directory holding kforge/),
e.g. `templates` for this checkout or `git archive REV templates | tar -x
-C D --strip-components=1` for another revision. Every run compares each
row's output with the host's top-k (topk_phases.cu); a wrong row fails the
script. Needs a GPU and nvcc (the device machine).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "topk_phases.cu")

# The spans printed: (label, first marks, last marks), each the first of
# its marks that the run reached; marks as in topk_phases.cu's kPhases (0
# is the CTA's start; 15 ends the third digit where one was counted). A
# span whose marks a run did not reach (a path not taken) prints "-".
SPANS = [
    ("start", (0,), (2,)),
    ("digit 0 count", (2,), (10,)),
    ("digit 0 boundary", (10,), (11,)),
    ("row pass", (11,), (20,)),
    ("to candidates", (20,), (21,)),
    ("later digits", (21,), (15, 13)),
    ("survivors", (15, 13), (22,)),
    ("indices", (22,), (23,)),
    ("end", (0,), (30,)),
]


def span(marks, first, last):
    b = next((marks[m] for m in first if m in marks), None)
    e = next((marks[m] for m in last if m in marks), None)
    return "-" if b is None or e is None else f"{e - b:.2f}"


def build(name, tree, out_dir):
    binary = os.path.join(out_dir, f"topk_phases_{name}")
    cmd = ["nvcc", "-std=c++17", "-O3", "-arch=sm_90a", "-I", tree, "-o", binary, SOURCE]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name}: nvcc failed:\n{done.stderr}")
    return binary


def run(binary, shape, runs):
    rows, length, mode = shape.split()
    done = subprocess.run([binary, rows, length, mode, str(runs)], capture_output=True,
                          text=True, timeout=120)
    text = done.stdout + done.stderr
    marks = {0: 0.0}
    for m in re.finditer(r"^\| (\d+) [^|]*\| ([\d.]+) \| ([\d.]+) \|", text, re.M):
        if float(m.group(2)) > 0:
            marks[int(m.group(1))] = float(m.group(2))
    kernel = re.search(r"events around one launch\): ([\d.]+) us; output (\w+)", text)
    if done.returncode != 0 or kernel is None or kernel.group(2) != "ok":
        sys.exit(f"{binary} {shape}: wrong output or failed run:\n{text}")
    return marks, float(kernel.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=TEMPLATES_DIR")
    ap.add_argument("--shapes", default="1 131072 cluster,1 32768 one,16 32768 one,4 65536 cluster")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runs", type=int, default=40)
    a = ap.parse_args()
    variants = []
    for v in a.variants:
        name, sep, tree = v.partition("=")
        if not sep or not os.path.isdir(os.path.join(tree, "kforge")):
            sys.exit(f"{v}: expected NAME=DIR with DIR/kforge/ (a template tree)")
        variants.append((name, tree))
    with tempfile.TemporaryDirectory() as tmp:
        binaries = {name: build(name, tree, tmp) for name, tree in variants}
        print("| shape | variant | round | " + " | ".join(s[0] for s in SPANS) +
              " | kernel (events) |")
        print("|---|---|---|" + "---:|" * (len(SPANS) + 1))
        for shape in a.shapes.split(","):
            for r in range(1, a.rounds + 1):
                for name, _ in variants:
                    marks, kernel = run(binaries[name], shape.strip(), a.runs)
                    cells = [span(marks, b, e) for _, b, e in SPANS]
                    print(f"| {shape.strip()} | {name} | {r} | " + " | ".join(cells) +
                          f" | {kernel:.2f} |", flush=True)


if __name__ == "__main__":
    main()
