#!/usr/bin/env python3
"""tests/random_gpt2_ids.py DIR [TRAIN VAL]: a folder of random GPT-2 token ids
for the benchmarks and make test-large, where the model's speed and memory,
not what it learns, are measured: DIR/train.bin and DIR/val.bin, TRAIN and VAL
(default 200000 and 20000) uint16 ids below 50257, from a fixed seed, and no
meta.json (so the vocabulary is GPT-2's 50257, as nanoGPT assumes)."""
import os
import random
import struct
import sys

folder = sys.argv[1]
counts = [int(n) for n in sys.argv[2:4]] or [200000, 20000]
os.makedirs(folder, exist_ok=True)
random.seed(7)
for name, n in zip(("train.bin", "val.bin"), counts):
    with open(os.path.join(folder, name), "wb") as f:
        f.write(struct.pack(f"<{n}H", *(random.randrange(50257) for _ in range(n))))
