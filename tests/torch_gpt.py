#!/usr/bin/python3
"""PyTorch reference for zerofiber's C GPT.

The model is nanoGPT's model.py GPT, bias=False or (GPT-2's) True: token + position
embeddings, L pre-LayerNorm blocks (causal self-attention, exact-GELU MLP),
a final LayerNorm and a head (lm_head) tied to the token embedding. Parameter
names are nanoGPT's state-dict names (transformer.wte.weight,
transformer.h.0.ln_1.weight, ..., lm_head.weight), so nanoGPT's own model
loads the same files.

Commands:

  grads --weights W.safetensors --batch B.safetensors --heads NH --out G.safetensors [--autocast]
      The C tests' oracle. Reads the weights (V, C, block and L are derived
      from the shapes) and a batch of I32 tensors "x" and "y" of shape [B,T],
      runs forward in float32 without dropout, backpropagates the mean
      cross-entropy loss and writes every weight's gradient (F32, same name
      and shape) plus the scalar "loss". A C test writes the two input files,
      runs this command and compares its own loss and gradients to the output.
      Exits 1 with one line on stderr on bad input. With --autocast the step
      runs in mixed precision as train's does, and the gradients written are
      the bf16 copy's, cast up to fp32.

  loss --ckpt CKPT.safetensors --batch B.safetensors
      Loads a bin/train checkpoint into the model strictly (load_state_dict
      with every nanoGPT name, lm_head.weight included; the optim.* tensors
      are the optimizer's and are left out), with n_head from the file's
      config, and prints the mean cross-entropy loss of the batch ("x", "y")
      without dropout.

  lr --lr LR --min-lr MIN --warmup W --decay-iters D --iters N
      Prints nanoGPT train.py's get_lr(it) for it = 0..N-1, one a line: the
      schedule written again in Python, for the C schedule to be checked
      against.

  adamw --weights W.safetensors --grads G.safetensors --lrs LR0,LR1,...
        --beta2 B2 --weight-decay WD --grad-clip MAX --out O.safetensors
      torch.optim.AdamW alone, on the weights W with nanoGPT's parameter
      groups (configure_optimizers: weight decay on the tensors of 2 or more
      dimensions, none on the others; betas (0.9, B2), eps 1e-8). Step k
      takes the gradients "step{k}.NAME" of G, clips them with
      torch.nn.utils.clip_grad_norm_(MAX) (MAX 0: no clipping) and steps at
      lr LRk. Writes, per step k, the weights "step{k}.NAME", Adam's state
      "step{k}.optim.exp_avg.NAME" and "step{k}.optim.exp_avg_sq.NAME", and
      the total norm before clipping "step{k}.norm".

  train --weights W.safetensors --batches B.safetensors --heads NH --lrs LR0,...
        --beta2 B2 --weight-decay WD --grad-clip MAX --out O.safetensors [--autocast]
      Full nanoGPT training steps (forward without dropout, loss.backward,
      clip_grad_norm_, AdamW as above, zero_grad) from the weights W over the
      batches "x" and "y" of B (I32, [K*B,T]: step k takes rows k*B..k*B+B-1) at the
      learning rates given. Where W is a bin/train checkpoint with Adam's
      state (optim.exp_avg.NAME, optim.exp_avg_sq.NAME and the metadata's
      adam_step), that state goes into the optimizer through
      optimizer.load_state_dict first, as a user resuming in PyTorch would
      load it. Writes the weights after each step ("step{k}.NAME"), the
      losses "loss" [K] and norms before clipping "norm" [K], and the
      optimizer's state after the last step ("optim.exp_avg.NAME",
      "optim.exp_avg_sq.NAME", named as the checkpoint names them). With
      --autocast, mixed precision as FSDP's
      MixedPrecision(param_dtype=torch.bfloat16) runs it: the weights are the
      fp32 master, each step refreshes a bf16 copy of them (round to nearest
      even), runs its forward and loss under torch.autocast("cpu",
      dtype=torch.bfloat16) as nanoGPT's train.py with dtype = 'bfloat16'
      does, and hands its bf16 gradients, cast up, to the master's clipping
      and AdamW. The embeddings' gradients sum in fp32 before their one
      rounding (as on CUDA; see embedding()).

  bf16 --floats F.bin --out O.bin
      PyTorch's own rounding, the reference for runtime/bf16.h: each float32 of
      F rounded by .to(torch.bfloat16), its 16 bits written little-endian.

  bench --preset char-small|char|gpt2|gpt2-4x256 [--iters N] [--threads K] [--data FILE]
        [--device cpu|cuda] [--modes eager,compiled] [--tf32] [--batch B] [--autocast] [--fused]
      Times full training steps of nanoGPT's shakespeare_char recipe
      (forward, backward, clip_grad_norm_(1.0), AdamW, zero_grad) as the
      baseline the C trainer is compared against, per mode (eager, and
      torch.compile(model) where torch has it) and thread count (1 to the
      cores), then prints the best ("best: ... N ms/iter"). On a GPU, fp32
      with TF32 off, or on with --tf32 (as bin/train's --tf32=1); --autocast
      runs the forward under bf16 autocast with flash attention (nanoGPT's
      dtype = 'bfloat16'), --fused steps a fused AdamW, --batch B takes B
      rows a step; each setting is printed, and a GPU's peak memory per mode.

safetensors is read and written by hand (json + struct + numpy): the
package is not installed.
"""

import argparse
import contextlib
import copy
import ctypes
import json
import math
import os
import re
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- safetensors

DTYPES = {"F32": np.dtype("<f4"), "I32": np.dtype("<i4")}


def read_safetensors(path):
    """Return {name: numpy array} for the F32/I32 tensors in a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: bad header JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    data = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name!r}: unsupported or malformed entry {info!r}") from None
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= len(data) \
                or end - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"{path}: tensor {name!r}: offsets {begin}..{end} do not fit shape {shape}")
        tensors[name] = np.frombuffer(data, dtype, offset=begin, count=math.prod(shape)).reshape(shape).copy()
    return tensors


def write_safetensors(path, tensors):
    """Write {name: float32 or int32 numpy array} as a safetensors file."""
    header, chunks, offset = {}, [], 0
    for name, array in tensors.items():
        code = {"float32": "F32", "int32": "I32"}[array.dtype.name]
        raw = np.ascontiguousarray(array, dtype=DTYPES[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.writelines(chunks)


# ---------------------------------------------------------------------- model

class LayerNorm(nn.Module):
    """LayerNorm with a weight and an optional bias, eps 1e-5 (nanoGPT's)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        if x.dtype == torch.bfloat16:
            # a bf16 model's: in fp32 on the bf16 values, the output rounded once, as CUDA's bf16
            # kernel computes (the CPU's sums the weight's and bias's gradients in bf16, an add at a time)
            bias = self.bias.float() if self.bias is not None else None
            return F.layer_norm(x.float(), self.weight.shape, self.weight.float(), bias, 1e-5).to(torch.bfloat16)
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, bias):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.dropout = dropout
        # nanoGPT's flash path where torch has it (2.0 on), its masked softmax before
        self.flash = hasattr(F, "scaled_dot_product_attention")
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                               dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd, dropout, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, bias):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout, bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = MLP(n_embd, dropout, bias)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def embedding(weight, idx):
    """weight's rows at idx. A bf16 weight's are gathered in fp32 and cast back (the same
    values), so that its gradient sums over the positions in fp32 and rounds once, as
    CUDA's embedding backward does (the CPU's, on a bf16 weight, rounds at every add)."""
    if weight.dtype == torch.bfloat16:
        return F.embedding(idx, weight.float()).to(torch.bfloat16)
    return F.embedding(idx, weight)


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, dropout=0.0, bias=False):
        super().__init__()
        if n_head <= 0 or n_embd % n_head:
            raise ValueError(f"{n_head} heads do not divide width {n_embd}")
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList(Block(n_embd, n_head, block_size, dropout, bias) for _ in range(n_layer)),
            ln_f=LayerNorm(n_embd, bias),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as in nanoGPT

    def init_weights(self):
        """nanoGPT's initialisation: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))."""
        std_proj = 0.02 / math.sqrt(2 * len(self.transformer.h))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, std_proj if name.endswith("c_proj.weight") else 0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        tr = self.transformer
        x = tr.drop(embedding(tr.wte.weight, idx) + embedding(tr.wpe.weight, torch.arange(T, device=idx.device)))
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# -------------------------------------------------------------------- threads

def openblas():
    """The OpenBLAS library loaded into this process (via torch), or None."""
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "libopenblas" in line})
    if not paths:
        return None
    lib = ctypes.CDLL(paths[0])
    lib.openblas_get_config.restype = ctypes.c_char_p
    lib.openblas_get_corename.restype = ctypes.c_char_p
    lib.path = paths[0]
    return lib


def set_threads(k):
    """Use k threads in torch's OpenMP pool and in OpenBLAS (which has its own pool)."""
    torch.set_num_threads(k)
    lib = openblas()
    if lib is not None:
        lib.openblas_set_num_threads(k)


# ---------------------------------------------------------------------- grads

def load_model(weights, n_head):
    """Build a GPT whose config is derived from the weight shapes, and load the weights
    (lm_head.weight, when absent, is the tied token embedding; optim.* is left out)."""
    weights = {n: a for n, a in weights.items() if not n.startswith("optim.")}
    if "lm_head.weight" not in weights and "transformer.wte.weight" in weights:
        weights["lm_head.weight"] = weights["transformer.wte.weight"]
    for name in ("transformer.wte.weight", "transformer.wpe.weight"):
        if name not in weights or weights[name].ndim != 2:
            raise ValueError(f"weights: missing or non-2-D {name}")
    V, C = weights["transformer.wte.weight"].shape
    block = weights["transformer.wpe.weight"].shape[0]
    L = len({m.group(1) for n in weights if (m := re.match(r"transformer\.h\.(\d+)\.", n))})
    model = GPT(V, block, L, n_head, C, bias="transformer.ln_f.bias" in weights)
    expected = model.state_dict()
    for name in sorted(set(expected) | set(weights)):
        if name not in weights:
            raise ValueError(f"weights: missing {name}")
        if name not in expected:
            raise ValueError(f"weights: unexpected {name} (config V={V} C={C} block={block} L={L})")
        if weights[name].dtype != np.float32 or tuple(weights[name].shape) != tuple(expected[name].shape):
            raise ValueError(f"weights: {name} is {weights[name].dtype}{list(weights[name].shape)}, "
                             f"expected float32{list(expected[name].shape)}")
    model.load_state_dict({n: torch.from_numpy(a) for n, a in weights.items()})
    return model


def autocast_if(on, device="cpu"):
    """The forward and the loss under torch.autocast(bfloat16) (nanoGPT's train.py with
    dtype = 'bfloat16'), the backward outside it."""
    return torch.autocast(device, dtype=torch.bfloat16) if on else contextlib.nullcontext()


def flash_only(on):
    """Scaled dot-product attention held to its flash kernel (torch 2.3 on), as a bf16
    run on a GPU picks by itself where it can; nothing otherwise."""
    attention = getattr(torch.nn, "attention", None)
    if not on or attention is None:
        return contextlib.nullcontext()
    return attention.sdpa_kernel([attention.SDPBackend.FLASH_ATTENTION])


def compute_copy(master, bf16):
    """The model a step computes with: the fp32 master itself, or with bf16 its copy in
    bf16 (FSDP's MixedPrecision(param_dtype=torch.bfloat16)), refreshed by copy_ (round
    to nearest even) before each step."""
    return copy.deepcopy(master).to(torch.bfloat16) if bf16 else master


def refresh(compute, master):
    """compute's parameters := master's, rounded to compute's dtype (nothing when they are one)."""
    if compute is not master:
        with torch.no_grad():
            for c, m in zip(compute.parameters(), master.parameters()):
                c.copy_(m)


def grads_to_master(compute, master):
    """The compute copy's gradients, cast up to fp32, as the master's .grad (as FSDP
    hands the sharded fp32 parameters theirs)."""
    if compute is not master:
        for c, m in zip(compute.parameters(), master.parameters()):
            m.grad = c.grad.float()
            c.grad = None


def cmd_grads(args):
    set_threads(1)
    model = load_model(read_safetensors(args.weights), args.heads)
    batch = read_safetensors(args.batch)
    V, block = model.transformer.wte.num_embeddings, model.transformer.wpe.num_embeddings
    for name in ("x", "y"):
        a = batch.get(name)
        if a is None or a.dtype != np.int32 or a.ndim != 2:
            raise ValueError(f"batch: {name} must be an I32 tensor of shape [B,T]")
        if a.size and (a.min() < 0 or a.max() >= V):
            raise ValueError(f"batch: {name} has token ids outside [0, {V})")
    x, y = batch["x"], batch["y"]
    if x.shape != y.shape or 0 in x.shape or x.shape[1] > block:
        raise ValueError(f"batch: x {list(x.shape)} and y {list(y.shape)} must be equal, non-empty, T <= {block}")
    model.train()  # dropout is 0, so train and eval agree
    compute = compute_copy(model, args.autocast)
    with autocast_if(args.autocast):
        loss = compute(torch.from_numpy(x).long(), torch.from_numpy(y).long())
    loss.backward()
    grads_to_master(compute, model)
    out = {n: p.grad.numpy() for n, p in model.named_parameters()}
    out["loss"] = np.array(loss.item(), dtype=np.float32)
    write_safetensors(args.out, out)


def read_metadata(path):
    """The __metadata__ object of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8")).get("__metadata__", {})


def cmd_loss(args):
    set_threads(1)
    config = json.loads(read_metadata(args.ckpt)["config"])
    model = load_model(read_safetensors(args.ckpt), config["n_head"])
    batch = read_safetensors(args.batch)
    model.eval()
    with torch.no_grad():
        loss = model(torch.from_numpy(batch["x"]).long(), torch.from_numpy(batch["y"]).long())
    print(f"{loss.item():.9g}")


# ------------------------------------------------------------------ optimizer

def get_lr(it, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """nanoGPT train.py's learning-rate schedule: linear warmup, cosine decay, then min_lr."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


def configure_optimizers(named_params, weight_decay, learning_rate, betas, fused=False):
    """nanoGPT's GPT.configure_optimizers: decay the tensors of 2 or more dimensions
    (matmul weights, embeddings), not the others (LayerNorm weights); fused (one
    kernel for every tensor) where asked, as nanoGPT asks it on a GPU."""
    params = [p for _, p in named_params if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    extra = {"fused": True} if fused else {}
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=1e-8, **extra)


def optimizer_step(optimizer, params, lr, grad_clip):
    """Clip the gradients of params to grad_clip (0: not at all) and step at lr;
    returns the total norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return norm.item()


def adam_state(optimizer, named_params, prefix=""):
    """Adam's m and v of each named parameter, under the checkpoint's names."""
    out = {}
    for name, p in named_params:
        state = optimizer.state[p]
        out[f"{prefix}optim.exp_avg.{name}"] = state["exp_avg"].numpy().copy()
        out[f"{prefix}optim.exp_avg_sq.{name}"] = state["exp_avg_sq"].numpy().copy()
    return out


def load_adam_state(optimizer, named_params, tensors, adam_step):
    """Put a checkpoint's optim.exp_avg.* and optim.exp_avg_sq.* into optimizer through
    its state_dict (the state is keyed by the parameters' order in its groups)."""
    names = {id(p): name for name, p in named_params}
    sd = optimizer.state_dict()
    order = [p for group in optimizer.param_groups for p in group["params"]]
    for index, p in enumerate(order):
        state = {"step": torch.tensor(float(adam_step))}
        for key in ("exp_avg", "exp_avg_sq"):
            name = f"optim.{key}.{names[id(p)]}"
            if name not in tensors or tuple(tensors[name].shape) != tuple(p.shape):
                raise ValueError(f"weights: missing {name} of shape {list(p.shape)}")
            state[key] = torch.from_numpy(tensors[name])
        sd["state"][index] = state
    optimizer.load_state_dict(sd)


def learning_rates(text):
    try:
        return [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def cmd_lr(args):
    for it in range(args.iters):
        print(f"{get_lr(it, args.lr, args.min_lr, args.warmup, args.decay_iters):.9g}")


def cmd_adamw(args):
    set_threads(1)
    weights, grads = read_safetensors(args.weights), read_safetensors(args.grads)
    named = [(n, nn.Parameter(torch.from_numpy(a))) for n, a in weights.items()]
    optimizer = configure_optimizers(named, args.weight_decay, args.lrs[0], (0.9, args.beta2))
    params = [p for _, p in named]
    out = {}
    for k, lr in enumerate(args.lrs):
        for name, p in named:
            g = grads.get(f"step{k}.{name}")
            if g is None or g.shape != tuple(p.shape):
                raise ValueError(f"grads: missing step{k}.{name} of shape {list(p.shape)}")
            p.grad = torch.from_numpy(g)
        out[f"step{k}.norm"] = np.array(optimizer_step(optimizer, params, lr, args.grad_clip), dtype=np.float32)
        out.update({f"step{k}.{n}": p.detach().numpy().copy() for n, p in named})
        out.update(adam_state(optimizer, named, f"step{k}."))
    write_safetensors(args.out, out)


def cmd_bf16(args):
    """Each float32 of --floats rounded by .to(torch.bfloat16): its 16 bits, to --out."""
    x = torch.from_numpy(np.fromfile(args.floats, dtype=np.float32))
    x.to(torch.bfloat16).view(torch.int16).numpy().tofile(args.out)


def cmd_train(args):
    set_threads(1)
    weights = read_safetensors(args.weights)
    model = load_model(weights, args.heads)
    named = list(model.named_parameters())  # the tied lm_head.weight once, as transformer.wte.weight
    optimizer = configure_optimizers(named, args.weight_decay, args.lrs[0], (0.9, args.beta2))
    if any(n.startswith("optim.") for n in weights):
        load_adam_state(optimizer, named, weights, int(read_metadata(args.weights)["adam_step"]))
    batches = read_safetensors(args.batches)
    x, y, K = batches.get("x"), batches.get("y"), len(args.lrs)
    if x is None or y is None or x.ndim != 2 or x.shape != y.shape or x.shape[0] % K:
        raise ValueError(f"batches: x and y must be I32 [K*B,T] with K = {K} learning rates")
    x, y = x.reshape(K, -1, x.shape[1]), y.reshape(K, -1, y.shape[1])
    model.train()  # dropout is 0, so train and eval agree
    compute = compute_copy(model, args.autocast)
    params = [p for _, p in named]
    losses, norms, out = [], [], {}
    for k, lr in enumerate(args.lrs):
        refresh(compute, model)
        with autocast_if(args.autocast):
            loss = compute(torch.from_numpy(x[k]).long(), torch.from_numpy(y[k]).long())
        loss.backward()
        grads_to_master(compute, model)
        norms.append(optimizer_step(optimizer, params, lr, args.grad_clip))
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        out.update({f"step{k}.{n}": p.detach().numpy().copy() for n, p in named})
    out["loss"] = np.array(losses, dtype=np.float32)
    out["norm"] = np.array(norms, dtype=np.float32)
    out.update(adam_state(optimizer, named))
    write_safetensors(args.out, out)


# ---------------------------------------------------------------------- bench

PRESETS = {
    "char-small": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, dropout=0.0, iters=50, warmup=5),
    "char": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2, iters=5, warmup=2),
    # GPT-2 124M as nanoGPT's train_gpt2 config makes it (biases, GPT-2's ids padded to 50304), at a batch two
    # cores can step: one row of 1024, or four of 256 (the position embedding cropped, as crop_block_size does)
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, batch_size=1, dropout=0.0, iters=5, warmup=2,
                 bias=True, vocab_size=50304),
    "gpt2-4x256": dict(n_layer=12, n_head=12, n_embd=768, block_size=256, batch_size=4, dropout=0.0, iters=5,
                       warmup=2, bias=True, vocab_size=50304),
}


def blas_report():
    """Lines saying which BLAS torch uses and how OpenBLAS picked its kernels."""
    show = torch.__config__.show()
    info = re.search(r"BLAS_INFO=([^,\s]+)", show)
    lines = [f"torch BLAS_INFO={info.group(1) if info else '?'} (torch.__config__.show())"]
    lib = openblas()
    if lib is None:
        lines.append("OpenBLAS: not loaded")
    else:
        core = lib.openblas_get_corename().decode()
        lines.append(f"OpenBLAS: {lib.path}: {lib.openblas_get_config().decode()}; core={core}")
        if core == "Prescott":
            lines.append("note: generic Prescott kernels; on AVX-512 CPUs OPENBLAS_CORETYPE=SkylakeX is much faster")
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "?")()
    lines.append(f"cpu capability {capability} (ATen's vectorised kernels), MKL "
                 f"{'on' if torch.backends.mkl.is_available() else 'off'}, oneDNN "
                 f"{'on' if torch.backends.mkldnn.is_available() else 'off'}")
    lines.append(" ".join(f"{v}={os.environ.get(v, '<unset>')}"
                          for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_WAIT_POLICY")))
    return lines


def time_steps(p, train, iters, warmup, device, compiled, autocast=False, fused=False):
    """Median ms of `iters` full nanoGPT training steps after `warmup` untimed ones
    (fp32, or the forward under bf16 autocast with attention held to flash; on a GPU,
    TF32 as --tf32 says and each step waited for), the first step's ms (the
    compilation's, when compiled) and the peak bytes allocated on a GPU (0 on the CPU).
    Compiled as nanoGPT's train.py compiles: torch.compile(model), the optimizer on the
    model's own parameters, fused AdamW where asked."""
    torch.manual_seed(1337)
    raw = GPT(p["vocab_size"], p["block_size"], p["n_layer"], p["n_head"], p["n_embd"], p["dropout"],
              p.get("bias", False))
    raw.init_weights()
    raw.to(device)
    raw.train()
    params = list(raw.parameters())
    optimizer = configure_optimizers(raw.named_parameters(), 0.1, 1e-3, (0.9, 0.99), fused)
    model = torch.compile(raw) if compiled else raw
    B, T = p["batch_size"], p["block_size"]
    times = []
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    for step in range(warmup + iters):
        t0 = time.perf_counter()
        ix = torch.randint(len(train) - T, (B,))
        x = torch.stack([train[i:i + T] for i in ix]).to(device)
        y = torch.stack([train[i + 1:i + T + 1] for i in ix]).to(device)
        with autocast_if(autocast, device), flash_only(autocast and device != "cpu"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()
        if step == 0:
            first = (time.perf_counter() - t0) * 1e3
        if step >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    peak = torch.cuda.max_memory_allocated() if device != "cpu" else 0
    return statistics.median(times), first, peak


def cmd_bench(args):
    p = dict(PRESETS[args.preset])
    iters = args.iters or p["iters"]
    p["batch_size"] = args.batch or p["batch_size"]
    if os.path.isdir(args.data):  # a folder of uint16 token ids (nanoGPT's train.bin), of the preset's vocabulary
        train = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.bin"), dtype=np.uint16).astype(np.int64))
        vocab = range(p["vocab_size"])
    else:  # a text file, its bytes the tokens
        with open(args.data, "rb") as f:
            text = f.read()
        vocab = sorted(set(text))
        lut = np.zeros(256, dtype=np.int64)
        lut[vocab] = np.arange(len(vocab))
        data = torch.from_numpy(lut[np.frombuffer(text, dtype=np.uint8)])
        train = data[:int(0.9 * len(data))]
        p["vocab_size"] = len(vocab)
    if len(train) <= p["block_size"]:
        raise ValueError(f"{args.data}: too short for block size {p['block_size']}")
    compute = "fp32"
    if args.autocast:
        compute = "bf16 autocast" + (", attention held to flash" if args.device != "cpu" else "")
    settings = f"{compute}, AdamW {'fused' if args.fused else 'for-each'}"
    if args.device == "cpu":
        for line in blas_report():
            print(line, flush=True)
        print(f"settings: {settings}", flush=True)
    else:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        print(f"device: {torch.cuda.get_device_name(0)}, {settings}, TF32 {'on' if args.tf32 else 'off'}",
              flush=True)
    print(f"vocab {p['vocab_size']}, {p['n_layer']} layers, {p['n_head']} heads, {p['n_embd']} wide, "
          f"block {p['block_size']}, batch {p['batch_size']}, dropout {p['dropout']}, warmup {p['warmup']}",
          flush=True)
    results = {}
    threads = [args.threads] if args.threads else range(1, (os.cpu_count() or 1) + 1)
    if args.device != "cpu":
        threads = [torch.get_num_threads()]
    for mode in args.modes:
        if mode == "compiled" and not hasattr(torch, "compile"):
            print(f"compiled: skipped, torch {torch.__version__} has no torch.compile", flush=True)
            continue
        for k in threads:
            set_threads(k)
            ms, first, peak = time_steps(p, train, iters, p["warmup"], args.device, mode == "compiled",
                                         args.autocast, args.fused)
            results[mode, k] = ms
            memory = f", peak memory {peak / 1e9:.2f} GB" if peak else ""
            print(f"torch {torch.__version__} {args.preset} {mode} threads={k}: {ms:.1f} ms/iter "
                  f"(median of {iters}; first step {first / 1e3:.1f} s){memory}", flush=True)
    mode, k = min(results, key=results.get)
    tokens = p["batch_size"] * p["block_size"] / (results[mode, k] / 1e3)
    print(f"best: torch {torch.__version__} {args.preset} {mode} threads={k}: {results[mode, k]:.1f} ms/iter "
          f"(median of {iters}), {tokens:.0f} tok/s on {args.device}")


# ----------------------------------------------------------------------- main

def positive(s):
    n = int(s)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{s} is not a positive integer")
    return n


def bench_modes(s):
    modes = s.split(",")
    if not modes or any(m not in ("eager", "compiled") for m in modes):
        raise argparse.ArgumentTypeError(f"'{s}' is not a list of eager and compiled")
    return modes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grads", help="loss and weight gradients for one batch")
    g.add_argument("--weights", required=True)
    g.add_argument("--batch", required=True)
    g.add_argument("--heads", required=True, type=positive)
    g.add_argument("--autocast", action="store_true",
                   help="mixed precision: a bf16 copy of the weights under torch.autocast(bfloat16)")
    g.add_argument("--out", required=True)
    lo = sub.add_parser("loss", help="a checkpoint's loss on a batch")
    lo.add_argument("--ckpt", required=True)
    lo.add_argument("--batch", required=True)
    r = sub.add_parser("lr", help="nanoGPT's get_lr over the first iterations")
    r.add_argument("--lr", required=True, type=float)
    r.add_argument("--min-lr", required=True, type=float)
    r.add_argument("--warmup", required=True, type=int)
    r.add_argument("--decay-iters", required=True, type=int)
    r.add_argument("--iters", required=True, type=positive)
    for name, text in (("adamw", "torch.optim.AdamW steps on given gradients"),
                       ("train", "full nanoGPT training steps")):
        o = sub.add_parser(name, help=text)
        o.add_argument("--weights", required=True)
        o.add_argument("--grads" if name == "adamw" else "--batches", required=True)
        if name == "train":
            o.add_argument("--heads", required=True, type=positive)
            o.add_argument("--autocast", action="store_true",
                           help="mixed precision: a bf16 copy of the weights under torch.autocast(bfloat16)")
        o.add_argument("--lrs", required=True, type=learning_rates)
        o.add_argument("--beta2", required=True, type=float)
        o.add_argument("--weight-decay", required=True, type=float)
        o.add_argument("--grad-clip", required=True, type=float)
        o.add_argument("--out", required=True)
    c = sub.add_parser("bf16", help="PyTorch's rounding to bfloat16, as raw bits")
    c.add_argument("--floats", required=True, help="a file of float32 values to round")
    c.add_argument("--out", required=True)
    b = sub.add_parser("bench", help="time nanoGPT training steps")
    b.add_argument("--preset", required=True, choices=sorted(PRESETS))
    b.add_argument("--iters", type=positive)
    b.add_argument("--threads", type=positive)
    b.add_argument("--data", default="data/tinyshakespeare.txt", help="a text file, or a folder of token ids")
    b.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    b.add_argument("--modes", default="eager,compiled", type=bench_modes)
    b.add_argument("--tf32", action="store_true", help="on a GPU: let matmuls use TF32 tensor cores")
    b.add_argument("--batch", type=positive, help="rows a step, in place of the preset's")
    b.add_argument("--autocast", action="store_true",
                   help="the forward under torch.autocast(bfloat16), attention held to flash on a GPU")
    b.add_argument("--fused", action="store_true", help="fused AdamW (one kernel for every tensor; a GPU's)")
    args = ap.parse_args()
    try:
        {"grads": cmd_grads, "loss": cmd_loss, "lr": cmd_lr, "adamw": cmd_adamw, "train": cmd_train,
         "bf16": cmd_bf16, "bench": cmd_bench}[args.command](args)
    except (OSError, ValueError, KeyError) as e:
        print(f"torch_gpt.py {args.command}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
