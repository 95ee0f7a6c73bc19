#!/usr/bin/env bash
# make bench: what overlapping communication buys (every strategy at N = 1, 2, 4
# over a modeled link: bench/results/overlap.{md,csv,png}; the same in bf16 on that
# link, computing and reducing: overlap_bf16.md; ZeRO-3 on two nodes of
# 4 ranks, fully sharded and hybrid, on a link of two tiers: hybrid.md), what finer units, the
# live-unit limit and recompute cost (bench/results/units.md), peak memory per rank
# against N (bench/results/memory.{md,png}), then the CPU presets
# against this machine's sgemm ceiling and the char-small step against
# PyTorch's nanoGPT, side by side in the same run: Debian's PyTorch 1.13, and
# PyTorch 2.x from PyPI eager and compiled where make bench-torch made its venv
# (bench/torch_peer.sh; one line saying how, where not), after --dtype=bf16 against fp32
# (bench/precision.sh: bench/results/precision.md); the step quiet and beside one
# and two busy loops (bench/load.sh: bench/results/load.md); then GPT-2 124M against
# PyTorch 2.x and its memory at N = 1..4 (bench/gpt2.sh); last, the performance aims beside
# this run's figures (bench/aims.py: bench/results/aims.md). The presets against sgemm go to
# cpu.md and the comparison with PyTorch 2.x to torch.md.
#
# The overlap table runs char-small with 8 blocks (each unit then a smaller part
# of the backward, as in larger models) and 0.25 MB buckets (so that DDP's
# buckets are single blocks, as PyTorch's 25 MB ones are in a large model).
#
# Past one process (bench/results/mpi.md): char-small as 2 processes x 2 ranks
# against 1 process x 4 ranks, same flags, on the same cores, the runs taken in
# turn, and the MPI transport's all-to-all over loopback (bench_mpi) at 2 and 4
# processes against the ring model of --link.
#
# PyTorch gets its best settings: OpenBLAS's SkylakeX kernels where the CPU has
# AVX-512 (Debian's OpenBLAS 0.3.21 otherwise falls back to generic ones), the
# better of its default OpenMP waiting and passive waiting, and the best thread
# count, which tests/torch_gpt.py searches; ours runs as bin/train runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh

bin=${1:-build/cpu/bin}
results=bench/results
mkdir -p $results

"$bin/bench_overlap" --layers=8 --bucket-mb=0.25 --iters=20 --log=$results/overlap.csv | tee $results/overlap.md
if command -v gnuplot >/dev/null; then
    # one row per strategy and N > 1: free-link step, step with overlap off, with overlap on
    awk -F, 'NR > 1 && $2 > 1 { key = $1 " N=" $2; if ($3 == "off") { c[key] = $7; off[key] = $4; order[++n] = key }
             else on[key] = $4 }
             END { for (i = 1; i <= n; i++) { k = order[i]; printf "\"%s\" %s %s %s\n", k, c[k], off[k], on[k] } }' \
        $results/overlap.csv > $results/overlap.dat
    gnuplot <<PLOT
set terminal pngcairo size 900,480
set output "$results/overlap.png"
set title "Training step: no modeled link (every collective free), and over the link, overlap off and on"
set ylabel "ms per step (median)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set key top left
set yrange [0:*]
set xtics rotate by -30
plot "$results/overlap.dat" using 2:xtic(1) title "free link (baseline)", \
     "" using 3 title "overlap off", "" using 4 title "overlap on"
PLOT
    rm -f $results/overlap.dat
    echo "wrote $results/overlap.md, $results/overlap.csv and $results/overlap.png"
else
    echo "wrote $results/overlap.md and $results/overlap.csv; no plot: gnuplot is missing (make deps installs it)"
fi
echo

# The link the overlap table chose, for the tables that follow on it
link=$(awk '/^link: modeled ring/ { gsub(",", "", $4); print $4 "," $6 }' $results/overlap.md)

# Mixed precision on the same link: computing in bf16 (ZeRO-3's gathers move the bf16 compute
# copy) and the gradients' reductions in bf16 (--reduce-dtype): half the bytes of each
"$bin/bench_overlap" --layers=8 --bucket-mb=0.25 --iters=20 --link="$link" --dtype=bf16 --reduce-dtype=bf16 \
    | tee $results/overlap_bf16.md
echo

# Two nodes of 4 ranks: ZeRO-3 fully sharded against hybrid sharding in groups of 4 (one a
# node), a node's own link ten times as fast as the one between the nodes
"$bin/bench_overlap" --zero=3 --gpus=8 --shard-ranks=4 --layers=8 --bucket-mb=0.25 --iters=15 --link=0.2,5 \
    --link-inter=0.02,20 | tee $results/hybrid.md
echo

# The cost of finer units, the live-unit limit and recompute: ZeRO-3 at N = 4 over the link
# the overlap table chose (bench_units, a row per choice)
"$bin/bench_units" --layers=8 --gpus=4 --iters=10 --link="$link" | tee $results/units.md
echo

# Peak memory per rank against N for each strategy (the char preset, the finest units,
# one row a rank): bin/zero_memory's table, and its plot
"$bin/zero_memory" --unit=tensor | tee $results/memory.md
if command -v gnuplot >/dev/null; then
    tools/plot_memory $results/memory.md $results/memory.png \
        "Peak memory per rank (allocator high-water mark over a step), char preset, --unit=tensor, 1 row a rank"
    echo "wrote $results/units.md, $results/memory.md and $results/memory.png"
fi
echo

# Past one process: char-small as 2 processes x 2 ranks against 1 x 4 on the same cores,
# and the MPI exchange's bandwidth against the ring model of --link
if command -v mpirun >/dev/null && [ -x "$bin/bench_mpi" ]; then
    mpi="mpirun --allow-run-as-root --oversubscribe"
    flags="--iters=25 --eval-every=0 --eval-iters=1 --log-every=1 --sample-chars=0"
    tmp=$(mktemp -d)
    for round in 1 2 3; do
        "$bin/train" $flags --gpus=4 | step_ms >> $tmp/one
        $mpi -np 2 "$bin/train" $flags --gpus=2 | step_ms >> $tmp/two
        $mpi --bind-to none -np 2 "$bin/train" $flags --gpus=2 | step_ms >> $tmp/unbound
    done
    {
        echo "char-small (bin/train's default preset, DDP), $flags, 3 rounds of each in turn;"
        echo "median ms/iter of the steps past the 5th of every round, quartiles in brackets"
        echo
        echo "| world | ms/iter (quartiles) | steps | vs 1 x 4 |"
        echo "|---|---|---|---|"
        read -r one one_lo one_hi one_n < <(spread < $tmp/one)
        for run in one two unbound; do
            read -r m lo hi n < <(spread < $tmp/$run)
            case $run in
                one) what="1 process x 4 ranks" ;;
                two) what="2 processes x 2 ranks (mpirun -np 2, its default core binding)" ;;
                unbound) what="2 processes x 2 ranks (mpirun -np 2 --bind-to none)" ;;
            esac
            awk -v w="$what" -v m=$m -v lo=$lo -v hi=$hi -v n=$n -v one=$one \
                'BEGIN { printf "| %s | %s (%s-%s) | %s | %.2fx |\n", w, m, lo, hi, n, m / one }'
        done
        echo
        for np in 2 4; do
            echo "bench_mpi at $np processes:"
            $mpi -np $np "$bin/bench_mpi"
            echo
        done
    } | tee $results/mpi.md
    rm -rf $tmp
    echo "wrote $results/mpi.md"
else
    echo "past one process: SKIP: no mpirun, or a build without MPI (make deps installs Open MPI)"
fi
echo

# bf16 against fp32: char-small's final val loss after 2000 steps, and its step time
bench/precision.sh "$bin"
echo

# Both presets against this machine's sgemm ceiling, and the simulator's overhead (cpu.md)
ours=$("$bin/bench_cpu" | tee $results/cpu.md >(cat >&2) | awk '$1 == "char-small" { print $2 }')

python=${ZF_PYTHON:-/usr/bin/python3}
echo
if "$python" -c 'import torch' 2>/dev/null; then
    coretype=${OPENBLAS_CORETYPE:-}
    if [ -z "$coretype" ] && grep -q avx512f /proc/cpuinfo; then coretype=SkylakeX; fi
    # its best of its default OpenMP waiting and passive waiting (either may win on two cores)
    theirs=$(for wait in default PASSIVE; do
            if [ $wait = PASSIVE ]; then wait_env=(env OMP_WAIT_POLICY=PASSIVE); else wait_env=(env -u OMP_WAIT_POLICY); fi
            "${wait_env[@]}" OPENBLAS_CORETYPE=$coretype "$python" tests/torch_gpt.py bench --preset char-small |
                tee >(sed "s/^/OpenMP $wait: /" >&2) |
                awk '$1 == "best:" { for (i = 2; i <= NF; i++) if ($i == "ms/iter") print $(i - 1) }'
        done | sort -g | head -1)
    awk -v ours="$ours" -v theirs="$theirs" 'BEGIN {
        printf "\nchar-small step: zerofiber %.1f ms, Debian'"'"'s PyTorch at its best %.1f ms: ", ours, theirs
        if (theirs >= ours) printf "%.2fx faster\n", theirs / ours
        else printf "%.2fx slower\n", ours / theirs }'
else
    echo "vs Debian's PyTorch: SKIP: PyTorch is not importable by $python (install python3-torch: make deps)"
fi
echo
bench/torch_peer.sh "$bin" | tee $results/torch.md
echo

# The step quiet and beside one and two busy loops, as bin/train runs, with its teams kept
# whole, and under each way OpenMP's idle threads may wait
bench/load.sh "$bin"
echo

# GPT-2 124M: its step against nanoGPT's model on PyTorch 2.x, the sgemm share, where the
# step goes, and its memory at N = 1..4 (bench/results/gpt2.md, gpt2_memory.{md,png})
bench/gpt2.sh "$bin"
echo

# The performance aims beside this run's figures (bench/results/aims.md)
python3 bench/aims.py $results
