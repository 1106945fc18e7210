#!/usr/bin/env python3
"""A PyTorch transformer whose attention is stillpoint's energy attention.

Trains the same small model twice on the quickstart's task (reverse a
sequence of 16 symbols; examples/configs/quickstart.yaml): once with
stillpoint.torch.EnergyAttention (the attention's output is the fixed point
of its energy, solved in C++, differentiated by the implicit function
theorem) and once with torch.nn.MultiheadAttention, and prints each one's
held-out token accuracy and median time per training step.

    PYTHONPATH=build-release/python python3 examples/python/torch_energy_attention.py
    ... --steps 20          # a quick run (the test suite's)
    ... --attention hopfield

The model is the quickstart's energy kind written in PyTorch: token and
position embeddings, one attention sublayer with a skip connection, a
pre-norm feed-forward sublayer, a final norm and a linear head.
"""
import argparse
import math
import statistics
import time

import torch
from torch import nn

import stillpoint
from stillpoint.torch import EnergyAttention

# The quickstart's task and model sizes.
LENGTH, VOCAB, TRAIN_EXAMPLES, TEST_EXAMPLES = 16, 16, 8192, 512
DIM, HEADS, HIDDEN = 64, 4, 128


class TorchAttention(nn.Module):
    """torch.nn.MultiheadAttention on layer-normed tokens (the energy blocks
    normalise their input themselves)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.attention = nn.MultiheadAttention(DIM, HEADS, batch_first=True)

    def forward(self, x):
        h = self.norm(x)
        return self.attention(h, h, h, need_weights=False)[0]


class Transformer(nn.Module):
    def __init__(self, attention):
        super().__init__()
        # Token and position tables N(0, 1), as stillpoint's models
        # (model.embedding_init_std): position must weigh as much as content,
        # since reversing routes by position.
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = nn.Parameter(torch.randn(LENGTH, DIM))
        self.attention = attention
        self.ffn_norm = nn.LayerNorm(DIM)
        self.ffn = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))
        self.final_norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        u = self.tokens(ids) + self.positions[: ids.shape[1]]
        h = u + self.attention(u)
        h = h + self.ffn(self.ffn_norm(h))
        return self.head(self.final_norm(h))


def accuracy(model, tokens, targets):
    model.eval()
    with torch.no_grad():
        predictions = model(tokens).argmax(-1)
    model.train()
    return (predictions == targets).float().mean().item()


def train(name, model, data, args):
    train_x, train_y, test_x, test_y = data
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = min(30, max(1, args.steps // 10))
    # Linear warm-up, then cosine decay (the quickstart's schedule).
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: (s + 1) / warmup if s < warmup
        else 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, args.steps - warmup))))
    generator = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(train_x), generator=generator)
    step_ms = []
    for step in range(1, args.steps + 1):
        start = ((step - 1) * args.batch_size) % len(train_x)
        batch = order[start:start + args.batch_size]
        began = time.perf_counter()
        logits = model(train_x[batch])
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), train_y[batch].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        step_ms.append(1000 * (time.perf_counter() - began))
        if step % args.eval_every == 0 or step == args.steps:
            print(f"{name}: step {step}/{args.steps}  loss {loss.item():.4f}  held-out accuracy "
                  f"{100 * accuracy(model, test_x, test_y):.2f}%", flush=True)
    return accuracy(model, test_x, test_y), statistics.median(step_ms)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument("--attention", default="probabilistic",
                        help="the stillpoint energy attention (default probabilistic)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    # One thread by default: at this size PyTorch's intra-op threads cost more
    # than they bring (docs/python.md has the measurement).
    parser.add_argument("--threads", type=int, default=1,
                        help="threads of both PyTorch and stillpoint (default 1)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 1 or args.eval_every < 1:
        parser.error("--steps and --eval-every must be >= 1")

    torch.set_num_threads(args.threads)
    stillpoint.set_num_threads(args.threads)
    # The trainer's data for seed 0: training set seed 1, held-out set seed 2.
    train_x, train_y = stillpoint.sequence_task("reverse", LENGTH, VOCAB, TRAIN_EXAMPLES,
                                                seed=2 * args.seed + 1)
    test_x, test_y = stillpoint.sequence_task("reverse", LENGTH, VOCAB, TEST_EXAMPLES,
                                              seed=2 * args.seed + 2)
    data = tuple(torch.from_numpy(a) for a in (train_x, train_y, test_x, test_y))

    results = []
    for name, make_attention in [
        (f"stillpoint.torch.EnergyAttention({args.attention})",
         lambda: EnergyAttention(args.attention, DIM, HEADS, seed=args.seed)),
        ("torch.nn.MultiheadAttention", TorchAttention),
    ]:
        torch.manual_seed(args.seed)
        model = Transformer(make_attention())
        results.append((name, *train(name, model, data, args)))

    print(f"\nreverse task, {args.steps} steps of batch {args.batch_size}, "
          f"{args.threads} thread{'s' if args.threads > 1 else ''}:")
    print(f"{'attention':<48} {'held-out accuracy':>17} {'ms/step':>8}")
    for name, acc, ms in results:
        print(f"{name:<48} {100 * acc:>16.2f}% {ms:>8.1f}")


if __name__ == "__main__":
    main()
