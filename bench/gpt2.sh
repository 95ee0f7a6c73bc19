#!/usr/bin/env bash
# bench/gpt2.sh [BIN]: the gpt2 preset (124M parameters, GPT-2's ids padded to
# 50304, biases, GELU's tanh form) on the CPU; make bench runs it (about half an
# hour on two cores). Into bench/results/gpt2.md:
#   - the training step at 1 x 1024 and 4 x 256 rows on one rank (BIN/bench_cpu
#     --gpt2), against nanoGPT's model (tests/torch_gpt.py bench: its GPT with
#     biases, exact GELU, flash attention) on PyTorch 2.x from the venv of make
#     venv. The peer's best setting is searched first, every one printed: eager
#     and torch.compile'd, 1 and 2 threads, each at its own default OpenMP
#     settings (ours too: neither gets OMP_WAIT_POLICY). Then rounds, each ours
#     then the peer's best at both shapes; the ratio of each round, its median
#     and range;
#   - the share of this machine's sgemm ceiling, counted as nanoGPT's
#     estimate_mfu counts (bench_cpu);
#   - where one step's time goes: a --trace of bin/train's second step at
#     1 x 1024, summed by kernel;
# and the memory table at N = 1..4 simulated ranks (bin/zero_memory, one row
# of 1024 a rank) into bench/results/gpt2_memory.{md,png}.
# The data: random GPT-2 ids (tests/random_gpt2_ids.py): speed and memory do
# not depend on what the ids say.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh

bin=${1:-build/cpu/bin}
results=bench/results
rounds=${GPT2_ROUNDS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data=$tmp/ids
tests/random_gpt2_ids.py "$data"
python=${ZF_VENV:-$HOME/.cache/zerofiber/venv}/bin/python
out=$results/gpt2.md

# ms/iter of bench_cpu's row for the shape (1x1024 or 4x256), and its share of sgemm
ours_ms() { awk -v row="$2" '$1 == row { print $2 }' "$1"; }
ours_share() { awk -v row="$2" '$1 == row { print $5 }' "$1"; }
# ms/iter of torch_gpt.py bench's best line
theirs_ms() { awk '$1 == "best:" { for (i = 2; i <= NF; i++) if ($i == "ms/iter") print $(i - 1) }' "$1"; }

{
echo "# gpt2 on the CPU: zerofiber against nanoGPT's model on PyTorch 2.x"
echo
echo '```'
"$bin/bench_cpu" --gpt2="$data" | tee "$tmp/ours0"
echo '```'
echo
if [ -x "$python" ]; then
    echo "PyTorch 2.x, every setting tried (median of 5 steps after 2, the first one's seconds in brackets):"
    echo
    echo '```'
    for preset in gpt2 gpt2-4x256; do
        "$python" tests/torch_gpt.py bench --preset $preset --data "$data" | tee "$tmp/search-$preset"
    done
    echo '```'
    echo
    declare -A best_mode best_threads
    for preset in gpt2 gpt2-4x256; do
        read -r mode threads < <(awk '$1 == "best:" { print $5, $6 }' "$tmp/search-$preset")
        best_mode[$preset]=$mode
        best_threads[$preset]=${threads#threads=}
        best_threads[$preset]=${best_threads[$preset]%:}
    done
    echo "rounds, in turn: zerofiber (bench_cpu --gpt2), then PyTorch at its best setting for each shape"
    echo "(gpt2: ${best_mode[gpt2]}, ${best_threads[gpt2]} thread(s); gpt2-4x256: ${best_mode[gpt2-4x256]}," \
         "${best_threads[gpt2-4x256]} thread(s)); ms per step, and how many times faster zerofiber is"
    echo
    echo "| round | 1x1024 zerofiber | 1x1024 PyTorch | ratio | 4x256 zerofiber | 4x256 PyTorch | ratio |"
    echo "|---|---|---|---|---|---|---|"
    for round in $(seq "$rounds"); do
        "$bin/bench_cpu" --gpt2="$data" > "$tmp/ours"
        line="| $round"
        for preset in gpt2 gpt2-4x256; do
            row=1x1024; [ $preset = gpt2 ] || row=4x256
            "$python" tests/torch_gpt.py bench --preset $preset --data "$data" --modes "${best_mode[$preset]}" \
                --threads "${best_threads[$preset]}" > "$tmp/theirs"
            a=$(ours_ms "$tmp/ours" $row) b=$(theirs_ms "$tmp/theirs")
            echo "$row $a $b" >> "$tmp/ratios"
            line="$line | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2fx", b / a }')"
        done
        echo "$line |"
    done
    echo
    for row in 1x1024 4x256; do
        awk -v row=$row '$1 == row { print $3 / $2 }' "$tmp/ratios" | sort -g | awk -v row=$row '{ r[++n] = $1 } END {
            printf "%s: zerofiber %.2fx as fast as PyTorch 2.x at its best (median of %d rounds, %.2fx to %.2fx)\n",
            row, r[int((n + 1) / 2)], n, r[1], r[n] }'
    done
else
    echo "vs PyTorch 2.x: not set up: make venv installs it from PyPI (about 5.6 GB)"
fi
echo
echo "share of the sgemm ceiling (first run above): 1x1024 $(ours_share "$tmp/ours0" 1x1024)," \
     "4x256 $(ours_share "$tmp/ours0" 4x256)"
echo
echo "where one step's time goes (bin/train --preset=gpt2 --batch=1, its second step traced, rank 0's stream, by kernel):"
echo
"$bin/train" --preset=gpt2 --data="$data" --batch=1 --grad-accum=1 --iters=2 --eval-every=0 --eval-iters=0 \
    --sample-chars=0 --trace="$tmp/trace.json" --trace-steps=2 > /dev/null
/usr/bin/python3 - "$tmp/trace.json" <<'EOF'
import collections, json, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
# the second step's spans: those after the first step's adamw_arena
updates = sorted(e["ts"] + e["dur"] for e in spans if e["name"] == "adamw_arena")
first_end = updates[len(updates) // 2 - 1]
step = [e for e in spans if e["ts"] >= first_end and e["pid"] == 0]
rows = collections.defaultdict(list)
for e in step:
    rows[e["tid"]].append(e)
total = collections.Counter()
for row in rows.values():  # leaves only: a span that holds another is a unit's, not a kernel's
    row.sort(key=lambda e: (e["ts"], -e["dur"]))
    for i, e in enumerate(row):
        nested = i + 1 < len(row) and row[i + 1]["ts"] < e["ts"] + e["dur"]
        if not nested:
            total[e["name"]] += e["dur"]
whole = sum(total.values())
print("| kernel | ms | share |")
print("|---|---|---|")
for name, us in total.most_common():
    print(f"| {name} | {us / 1e3:.0f} | {100 * us / whole:.1f}% |")
print(f"| all | {whole / 1e3:.0f} | 100% |")
EOF
} | tee "$out"
echo "wrote $out"

"$bin/zero_memory" --preset=gpt2 --data="$data" --gpus=4 | tee $results/gpt2_memory.md
if command -v gnuplot >/dev/null; then
    tools/plot_memory $results/gpt2_memory.md $results/gpt2_memory.png \
        "Peak memory per rank over a step, gpt2 preset (124M), 1 row of 1024 a rank"
    echo "wrote $results/gpt2_memory.md and $results/gpt2_memory.png"
fi
