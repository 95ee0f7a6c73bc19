#!/usr/bin/env python3
"""bench/aims.py: the performance aims beside what this run of make bench measured.

Reads the tables make bench wrote in bench/results/ (torch.md, cpu.md,
overlap.md, load.md, gpt2.md) and prints one row per aim: this run's figure,
the aim and whether the figure meets it. A table the run did not
write (no PyTorch venv, say) gives its row as "not measured". Writes the same
Markdown to bench/results/aims.md.
"""
import os
import re
import sys

RESULTS = sys.argv[1] if len(sys.argv) > 1 else "bench/results"


def read(name):
    path = os.path.join(RESULTS, name)
    return open(path).read() if os.path.exists(path) else ""


def first(pattern, text):
    m = re.search(pattern, text, re.M)
    return m.groups() if m else None


rows = []  # (aim, figure, target, verdict: met, not met, or - where not measured)


def aim(what, figure, target, met):
    rows.append((what, figure if figure is not None else "not measured", target,
                 "-" if figure is None else ("met" if met else "**not met**")))


# char-small against PyTorch 2.x at its best (bench/torch_peer.sh)
m = first(r"^char-small step: zerofiber .* at its best \((.*)\): ([\d.]+)x \(median of the rounds; (.*)\)", read("torch.md"))
aim("char-small step against PyTorch 2.x at its best",
    m and f"{m[1]}x (rounds {m[2]}; PyTorch's best: {m[0]})", "2.0x", m and float(m[1]) >= 2.0)

# the presets against this machine's sgemm (bench_cpu)
cpu = read("cpu.md")
for preset, target in (("char", 85), ("char-small", 75)):
    m = first(rf"^{re.escape(preset)} +[\d.]+ +\d+ +[\d.]+ +(\d+)%", cpu)
    aim(f"{preset} preset's share of the sgemm ceiling", m and f"{m[0]}%", f"{target}%", m and int(m[0]) >= target)

# overlap at N = 4 on the modeled link (bench_overlap)
overlap = read("overlap.md")
for strategy in ("DDP", "ZeRO-2", "ZeRO-3"):
    m = first(rf"^\| {re.escape(strategy)} \| 4 \| on \|.*\| (\d+)%[^|]*\|\s*$", overlap)
    aim(f"{strategy} at N = 4: communication hidden", m and f"{m[0]}%", "90%", m and int(m[0]) >= 90)

# beside two busy loops, as bin/train runs (bench/load.sh)
load = read("load.md")
for model in ("char-small", "tiny"):
    m = first(rf"^\| {re.escape(model)} \| as bin/train runs \|.*\| ([\d.]+)x \| ([\d.]+)x \|\s*$", load)
    aim(f"{model} beside two busy loops: step against quiet", m and f"{m[1]}x (one loop: {m[0]}x)", "3x or less",
        m and float(m[1]) <= 3.0)

# the gpt2 preset against PyTorch 2.x at its best (bench/gpt2.sh)
gpt2 = read("gpt2.md")
for shape in ("1x1024", "4x256"):
    m = first(rf"^{shape}: zerofiber ([\d.]+)x as fast as PyTorch 2.x at its best \(median of \d+ rounds, (.*)\)", gpt2)
    aim(f"gpt2 preset ({shape}) against PyTorch 2.x at its best", m and f"{m[0]}x ({m[1]})", "1.5x",
        m and float(m[0]) >= 1.5)

lines = ["| aim | this run | the aim | |", "|---|---|---|---|"]
lines += [f"| {what} | {figure} | {target} | {met} |" for what, figure, target, met in rows]
text = ("The performance aims against this run's tables (bench/results/: torch.md, cpu.md, overlap.md, load.md, "
        "gpt2.md)\n\n" + "\n".join(lines) + "\n")
print(text, end="")
with open(os.path.join(RESULTS, "aims.md"), "w") as out:
    out.write(text)
