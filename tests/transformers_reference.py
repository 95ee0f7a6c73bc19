"""Hugging Face's transformers as the reference for GPT-2 folders (model/hf_gpt2.h).

Run by tests/test_hf.c with the venv's Python (make venv: PyTorch 2.x and
transformers from PyPI). No weights are downloaded: each model is a randomly
initialised GPT2LMHeadModel.

  make DIR VOCAB POSITIONS EMBD LAYERS HEADS SEED
      a random GPT2LMHeadModel (every parameter, biases and LayerNorms too,
      moved off its initial value) saved with save_pretrained into DIR
  legacy DIR OUT
      DIR's model as older files hold it: names without "transformer.", the
      causal mask's buffers attn.bias and attn.masked_bias, lm_head.weight
  logits DIR TOKENS OUT B T
      the logits of the int32 batch [B, T] in file TOKENS, as float32 [B, T, V] to OUT
  generate DIR N ID...
      the greedy continuation (generate, do_sample=False) of the prompt ids: N new ids, printed
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import GPT2Config, GPT2LMHeadModel


def make(folder, vocab, positions, embd, layers, heads, seed):
    torch.manual_seed(int(seed))
    config = GPT2Config(vocab_size=int(vocab), n_positions=int(positions), n_embd=int(embd), n_layer=int(layers),
                        n_head=int(heads), bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        for p in model.parameters():  # the tied head is wte: moved once
            p.add_(torch.randn_like(p) * 0.3)
    model.save_pretrained(folder)


def legacy(folder, out):
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(folder, "config.json"), out)
    model = GPT2LMHeadModel.from_pretrained(folder)
    config = model.config
    tensors = {}
    for name, value in model.transformer.state_dict().items():
        tensors[name] = value.detach().numpy().copy()
    p = config.n_positions
    for layer in range(config.n_layer):
        tensors[f"h.{layer}.attn.bias"] = np.tril(np.ones((p, p), dtype=np.uint8)).reshape(1, 1, p, p)
        tensors[f"h.{layer}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    tensors["lm_head.weight"] = tensors["wte.weight"].copy()
    save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def logits(folder, tokens_path, out, batch, time):
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    tokens = np.fromfile(tokens_path, dtype=np.int32).reshape(int(batch), int(time))
    with torch.no_grad():
        result = model(torch.from_numpy(tokens).long()).logits
    result.float().numpy().astype(np.float32).tofile(out)


def generate(folder, n, *prompt):
    model = GPT2LMHeadModel.from_pretrained(folder).eval()
    ids = torch.tensor([[int(x) for x in prompt]])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=int(n), do_sample=False,
                             pad_token_id=0)
    print(" ".join(str(int(x)) for x in out[0, len(prompt):]))


if __name__ == "__main__":
    torch.set_num_threads(1)
    commands = {"make": make, "legacy": legacy, "logits": logits, "generate": generate}
    commands[sys.argv[1]](*sys.argv[2:])
