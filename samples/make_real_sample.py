#!/usr/bin/python3
"""Writes a real gradient dump of a tiny Llama-style model, with its activation statistics.

Run with Debian's python3 and python3-torch (scripts/setup.sh does not install torch: the
files this writes are committed, and only regenerating them needs it):

    /usr/bin/python3 samples/make_real_sample.py

The model: byte-level, 2 decoder layers, d_model 128, 4 heads, SwiGLU MLP (hidden 384),
RMSNorm, rotary positions, tied-free LM head; trained with AdamW on the project's own text
files (README, FORMAT.md, the man page) for `--steps` steps on CPU with a fixed seed. At
the last step it saves:

  llama_grads.npz        the gradient of every parameter (float32; names as in PyTorch)
  llama_acts.npz         for every Linear layer, A = X^T X / n of its input activations at
                         that step, named like the layer's weight: what `giftc fit
                         --activations` takes
  llama_grads_early.npz  the gradients 25 steps earlier, for bases fitted on stale data

Every run with the same torch build and inputs writes the same values.
"""
import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rotary(x, pos):
    half = x.shape[-1] // 2
    freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    ang = pos[:, None] * freq[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.mlp_norm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        h = self.attn_norm(x)
        pos = torch.arange(t, dtype=torch.float32)
        q = self.q_proj(h).view(b, t, self.heads, -1).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.heads, -1).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.heads, -1).transpose(1, 2)
        q, k = rotary(q, pos), rotary(k, pos)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + self.o_proj((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(nn.Module):
    def __init__(self, d=128, layers=2, heads=4, hidden=384, vocab=256):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d, heads, hidden) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def corpus():
    text = b""
    for rel in ("README.md", "format/FORMAT.md", "man/giftc.1", "libcodec/include/gift/gift.h"):
        with open(os.path.join(ROOT, rel), "rb") as f:
            text += f.read()
    return torch.tensor(list(text), dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=os.path.join(ROOT, "samples"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    data = corpus()
    model = TinyLlama()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    stats = {}

    def hook(name):
        def f(module, inputs):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).double()
            stats[name] = (x.T @ x / x.shape[0]).float().numpy()
        return f

    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(hook(name + ".weight"))
    gen = torch.Generator().manual_seed(1)
    batch, ctx = 16, 128
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, len(data) - ctx - 1, (batch,), generator=gen)
        x = torch.stack([data[s:s + ctx] for s in starts])
        y = torch.stack([data[s + 1:s + ctx + 1] for s in starts])
        loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if step in (args.steps - 25, args.steps):
            grads = {n: p.grad.detach().float().numpy() for n, p in model.named_parameters()}
            suffix = "" if step == args.steps else "_early"
            np.savez(os.path.join(args.out, f"llama_grads{suffix}.npz"), **grads)
            if step == args.steps:
                np.savez(os.path.join(args.out, "llama_acts.npz"), **stats)
        opt.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
