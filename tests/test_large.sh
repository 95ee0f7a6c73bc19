#!/usr/bin/env bash
# make test-large: the gates on the gpt2 preset's whole model, too slow for CI
# (about 11 minutes on two cores): 124M parameters (12 layers, 12 heads, 768
# wide, block 1024, GPT-2's 50257 ids padded to 50304, biases, GELU's tanh
# form), 2 steps of one 1024-token row a rank on 2 ranks. Bytes compared:
#   - ZeRO-1, ZeRO-2 and ZeRO-3 save DDP's checkpoint, byte for byte;
#   - 2 processes x 1 rank (mpirun) save the checkpoint of 1 process x 2 ranks;
#   - ZeRO-3's checkpoint after step 1, resumed under DDP, ends at DDP's bytes;
#   - a Hugging Face gpt2 of the same shape (a random GPT2LMHeadModel from the
#     venv of make venv) trains from --init-from, its loss falling.
# The data: random GPT-2 ids in a folder without meta.json (GPT-2's 50257).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-bin}
dir=build/large
python=${ZF_VENV:-$HOME/.cache/zerofiber/venv}/bin/python
mpirun=${ZF_MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
rm -rf "$dir" && mkdir -p "$dir"

tests/random_gpt2_ids.py "$dir/data"

flags="--preset=gpt2 --data=$dir/data --batch=1 --grad-accum=1 --warmup=0 --eval-every=0 --eval-iters=1
       --sample-chars=0 --log-every=1"
run() {  # NAME FLAGS...: a run saving $dir/NAME/ckpt.safetensors
    local name=$1
    shift
    echo "== $name: $*"
    "$@" --out="$dir/$name" >"$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; echo "test-large: $name failed" >&2; exit 1; }
    grep -E "^model:|^done:" "$dir/$name.out"
}
same() {  # A B: the two checkpoints, byte for byte
    cmp "$dir/$1/ckpt.safetensors" "$dir/$2/ckpt.safetensors" ||
        { echo "test-large: $1 and $2 saved other bytes" >&2; exit 1; }
    echo "same bytes: $1 and $2"
}

for zero in 0 1 2 3; do run "zero$zero" "$bin/train" $flags --iters=2 --gpus=2 --zero=$zero; done
for zero in 1 2 3; do same zero0 "zero$zero"; done

run mpi $mpirun -np 2 "$bin/train" $flags --iters=2 --gpus=1 --zero=3
same zero3 mpi

run half "$bin/train" $flags --iters=1 --gpus=2 --zero=3
mkdir -p "$dir/resumed"
cp "$dir/half/ckpt.safetensors" "$dir/resumed/"
run resumed "$bin/train" $flags --iters=2 --gpus=2 --zero=0 --resume="$dir/resumed/ckpt.safetensors"
same zero0 resumed

"$python" tests/transformers_reference.py make "$dir/hf" 50257 1024 768 12 12 7 >/dev/null 2>&1 ||
    { echo "test-large: transformers could not make a random gpt2 (make venv)" >&2; exit 1; }
run from_hf "$bin/train" $flags --iters=4 --gpus=2 --zero=3 --lr=1e-4 --init-from="$dir/hf"
grep -q "a Hugging Face GPT-2" "$dir/from_hf.out"
awk '$1 == "iter" { loss[n++] = $4 + 0 } END {
    if (n < 2 || !(loss[n - 1] < loss[0])) { print "test-large: the loss did not fall from the Hugging Face start"; exit 1 }
    printf "from Hugging Face gpt2: loss %.4f -> %.4f in %d steps\n", loss[0], loss[n - 1], n }' "$dir/from_hf.out"
echo "test-large: passed"
