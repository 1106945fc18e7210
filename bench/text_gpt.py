#!/usr/bin/env python3
"""A character-level GPT in PyTorch: the peer of examples/configs/text.yaml.

Reads the same text the same way as stillpoint's task.kind text
(training/data/text_corpus.h): UTF-8 code points (or bytes), the last
--validation-fraction held out, the vocabulary of the training part after an
unknown id 0, training windows of --context characters at random offsets,
and the held-out part evaluated whole in consecutive windows (every held-out
character after the first predicted once). The model is a pre-norm GPT
(token and learned position embeddings, causal multi-head attention, GELU
MLP of 4x the width, no dropout), trained with AdamW, linear warm-up and
cosine decay, gradient clipping at 1.

Prints one JSON line: held-out loss (nats/char) and bpc after --steps steps,
the median milliseconds per step, peak resident memory, parameters.

    python3 bench/text_gpt.py [--path FILE] [--steps 2000] [--threads 2]
"""
import argparse
import gzip
import json
import math
import resource
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_symbols(path, encoding):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if encoding == "bytes":
        return list(data)
    return [ord(c) for c in data.decode("utf-8")]


def split_text(symbols, context, validation_fraction):
    held = int(math.floor(validation_fraction * len(symbols)))
    train, test = symbols[: len(symbols) - held], symbols[len(symbols) - held :]
    vocabulary = sorted(set(train))
    ids = {s: i + 1 for i, s in enumerate(vocabulary)}  # 0: unknown
    train_ids = torch.tensor([ids[s] for s in train], dtype=torch.long)
    test_ids = [ids.get(s, 0) for s in test]
    # Consecutive windows; targets -1 where there is no next character.
    inputs, targets = [], []
    for begin in range(0, held - 1, context):
        x = [0] * context
        y = [-1] * context
        for t in range(context):
            if begin + t >= held:
                break
            x[t] = test_ids[begin + t]
            if begin + t + 1 < held:
                y[t] = test_ids[begin + t + 1]
        inputs.append(x)
        targets.append(y)
    return (len(vocabulary) + 1, train_ids, torch.tensor(inputs), torch.tensor(targets))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        shape = (B, T, self.heads, C // self.heads)
        q, k, v = (a.view(shape).transpose(1, 2) for a in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        y = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class CharGpt(nn.Module):
    def __init__(self, vocab, context, width, heads, layers):
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def held_out_loss(model, inputs, targets, batch=256):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(inputs), batch):
            logits = model(inputs[i : i + batch])
            y = targets[i : i + batch]
            total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-1,
                                     reduction="sum").item()
            count += int((y >= 0).sum())
    model.train()
    return total / count


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--path", default="/usr/share/doc/jargon-text/jargon.txt.gz")
    p.add_argument("--encoding", default="utf-8", choices=["utf-8", "bytes"])
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--validation-fraction", type=float, default=0.1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    vocab, train_ids, test_x, test_y = split_text(
        read_symbols(a.path, a.encoding), a.context, a.validation_fraction)
    model = CharGpt(vocab, a.context, a.width, a.heads, a.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    step_ms = []
    generator = torch.Generator().manual_seed(a.seed)
    offsets = torch.arange(a.context)
    for step in range(a.steps):
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            progress = (step - a.warmup) / max(1, a.steps - a.warmup)
            lr = a.min_lr + 0.5 * (a.lr - a.min_lr) * (1 + math.cos(math.pi * progress))
        for group in optimizer.param_groups:
            group["lr"] = lr
        start = time.perf_counter()
        begins = torch.randint(len(train_ids) - a.context, (a.batch,), generator=generator)
        x = train_ids[begins[:, None] + offsets]
        y = train_ids[begins[:, None] + offsets + 1]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step_ms.append(1000 * (time.perf_counter() - start))
    loss = held_out_loss(model, test_x, test_y)
    print(json.dumps({
        "peer": "pytorch char GPT", "torch": torch.__version__, "steps": a.steps,
        "parameters": sum(p.numel() for p in model.parameters()),
        "test_loss": loss, "test_bpc": loss / math.log(2),
        "median_ms_per_step": statistics.median(step_ms),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": a.threads}))


if __name__ == "__main__":
    main()
