#!/usr/bin/env bash
# bench/precision.sh: --dtype=bf16 against fp32 on the CPU (bench/results/precision.md).
#
# Quality: bin/train's default run (char-small, 2000 steps) as ZeRO-3 on 4 ranks, in fp32,
# in bf16, and in bf16 with the gradients reduced (and so held) in bf16, from the same seed,
# and each run's final val loss. Speed: char-small's step on one rank and on four, fp32 and
# bf16 taken in turn, 3 rounds, the median ms/iter of the steps past the 5th with its
# quartiles. bf16 here is a bf16 copy of the weights, each block's kept internals in bf16,
# and bf16 values in fp32 buffers for the ops (docs/precision.md): what it costs is the
# rounding passes, the weight copies and the kept blocks' conversions.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/timing.sh

bin=${1:-build/cpu/bin}
results=bench/results
mkdir -p $results
tmp=$(mktemp -d)
{
    echo "## Quality: char-small, 2000 steps, --zero=3 --gpus=4, seed 1337"
    echo
    echo "| --dtype | --reduce-dtype | final val loss | steps' wall time |"
    echo "|---|---|---|---|"
    for run in fp32:fp32 bf16:fp32 bf16:bf16; do
        dtype=${run%:*} reduce=${run#*:}
        "$bin/train" --zero=3 --gpus=4 --dtype=$dtype --reduce-dtype=$reduce --sample-chars=0 > $tmp/quality_$run
        awk -v d=$dtype -v r=$reduce '$1 == "done:" { for (i = 1; i <= NF; i++) { if ($i == "loss") v = $(i + 1); if ($i == "in") s = $(i + 1) }
            printf "| %s | %s | %s | %s s |\n", d, r, v, s }' $tmp/quality_$run
    done
    awk '$1 == "done:" { for (i = 1; i <= NF; i++) if ($i == "loss") v[n++] = $(i + 1) }
         END { printf "\nbf16 - fp32: %+.4f; bf16 reduced in bf16 - fp32: %+.4f (the aim: within 0.02)\n\n",
                      v[1] - v[0], v[2] - v[0] }' \
        $tmp/quality_fp32:fp32 $tmp/quality_bf16:fp32 $tmp/quality_bf16:bf16

    flags="--iters=60 --eval-every=0 --eval-iters=1 --log-every=1 --sample-chars=0"
    echo "## Speed: char-small, $flags, 3 rounds of each in turn"
    echo
    echo "| ranks | fp32 ms/iter (quartiles) | bf16 ms/iter (quartiles) | bf16 / fp32 |"
    echo "|---|---|---|---|"
    for ranks in 1 4; do
        for round in 1 2 3; do
            for dtype in fp32 bf16; do "$bin/train" $flags --gpus=$ranks --dtype=$dtype | step_ms >> $tmp/${dtype}_$ranks; done
        done
        read -r f f_lo f_hi f_n < <(spread < $tmp/fp32_$ranks)
        read -r b b_lo b_hi b_n < <(spread < $tmp/bf16_$ranks)
        awk -v r=$ranks -v f=$f -v fl=$f_lo -v fh=$f_hi -v b=$b -v bl=$b_lo -v bh=$b_hi \
            'BEGIN { printf "| %d | %s (%s-%s) | %s (%s-%s) | %.2fx |\n", r, f, fl, fh, b, bl, bh, b / f }'
    done
} | tee $results/precision.md
rm -rf $tmp
echo "wrote $results/precision.md"
