#!/usr/bin/env python3
"""Projected step time and efficiency of `mpirun stillpoint train` on N nodes (docs/scale.md).

    python3 bench/scale_projection.py --w1-ms 450 --w2-ms 1500 --gflops 6.1

Inputs measured on this machine (bench/RESULTS.md): the step time of one rank
on its whole batch for W1 and W2 (`stillpoint bench w1|w2 --threads 1`), and
the GFLOP/s that W1 step reached (to time the 8x wider model from its FLOPs).
Published interconnect figures are below (INTERCONNECTS). The model, with
its assumptions, is in docs/scale.md; this prints its tables as Markdown.
"""
import argparse
import math

# Nominal per-direction link bandwidth (bytes/s) and a typical MPI small-message
# latency (s) for each interconnect: 10/25/100 GbE from the IEEE 802.3 line rates
# (TCP latency of tens of microseconds), InfiniBand EDR (100 Gb/s) and HDR
# (200 Gb/s) from their line rates (MPI latency about 1 microsecond).
INTERCONNECTS = [
    ("10 GbE", 10e9 / 8, 25e-6),
    ("25 GbE", 25e9 / 8, 15e-6),
    ("100 GbE", 100e9 / 8, 10e-6),
    ("InfiniBand EDR (100 Gb/s)", 100e9 / 8, 1.5e-6),
    ("InfiniBand HDR (200 Gb/s)", 200e9 / 8, 1.2e-6),
]
NODES = [1, 2, 4, 8, 16, 32, 64]
BUCKET = 1 << 20  # GradientReducerOptions::bucket_bytes


def parameters(d, hidden, vocab, length):
    """SequenceModel(implicit, deq_transformer) parameters (W1: 37712)."""
    cell = 4 * (d * d + d) + (d * hidden + hidden + hidden * d + d) + 4 * d
    return cell + vocab * d + length * d + (d * vocab + vocab) + 2 * d


def step_flops(b, t, d, hidden, vocab, k):
    """TransformerStepFlops (training/cli/bench_command.h), implicit, K iterations."""
    l = 2 * b * t * (4 * d * d + 2 * d * hidden)
    a = 4 * b * t * t * d
    return k * (l + a) + 4 * b * t * d * hidden + k * (l + 2 * a) + (2 * l + 2 * a) + 6 * b * t * d * vocab


def reduce_seconds(gradient_bytes, nodes, bandwidth, latency):
    """GradientReducer: per bucket, a chain through the nodes, then a broadcast from the last.

    Chain: (P - 1) hops of latency + bytes / bandwidth. Broadcast: a binomial tree for small
    buckets (log2 P hops), scatter + allgather for large ones (about 2 x bytes / bandwidth plus
    log2 P latencies): the cheaper of the two. A bucket's broadcast runs while the next bucket's
    chain does (a two-stage pipeline): each bucket costs the longer of the two stages, and the
    last one's shorter stage comes on top.
    """
    if nodes == 1:
        return 0.0
    total = 0.0
    left = gradient_bytes
    hops = math.ceil(math.log2(nodes))
    while left > 0:
        b = min(BUCKET, left)
        left -= b
        chain = (nodes - 1) * (latency + b / bandwidth)
        broadcast = min(hops * (latency + b / bandwidth), 2 * hops * latency + 2 * b / bandwidth)
        total += max(chain, broadcast)
        last = min(chain, broadcast)
    total += last
    # The step's small collectives (ExchangeStepTotals: a max and a gather of a few
    # hundred bytes), each about 2 log2 P latencies.
    return total + 2 * 2 * hops * latency


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--w1-ms", type=float, required=True, help="W1 step, one rank, ms")
    parser.add_argument("--w2-ms", type=float, required=True, help="W2 step, one rank, ms")
    parser.add_argument("--gflops", type=float, required=True, help="W1 GFLOP/s of one rank")
    args = parser.parse_args()

    w1_flops = step_flops(32, 32, 64, 128, 16, 16)
    wide_flops = step_flops(32, 32, 512, 1024, 16, 16)
    workloads = [
        # name, compute seconds of one node's share (weak scaling: the SPEC batch per node),
        # gradient bytes (float32), rows of the SPEC batch
        ("W1 (d 64, B 32 x T 32)", args.w1_ms / 1e3, 4 * parameters(64, 128, 16, 32), 32),
        ("W2 (d 64, B 8 x T 256)", args.w2_ms / 1e3, 4 * parameters(64, 128, 16, 256), 8),
        ("W1 8x wider (d 512, hidden 1024)", wide_flops / (args.gflops * 1e9),
         4 * parameters(512, 1024, 16, 32), 32),
    ]
    print(f"W1 step {w1_flops / 1e9:.2f} GFLOP; 8x wider {wide_flops / 1e9:.1f} GFLOP\n")
    for name, compute, grad_bytes, rows in workloads:
        print(f"### {name}: {grad_bytes / 2**20:.2f} MiB of gradients, "
              f"{compute * 1e3:.0f} ms of compute per node per step\n")
        print("Weak scaling (each node keeps the SPEC batch; the job's batch grows with the "
              "nodes). Step ms (efficiency = compute / step), no overlap:\n")
        print("| interconnect | " + " | ".join(f"{n} nodes" for n in NODES[1:]) + " |")
        print("|---|" + "---|" * (len(NODES) - 1))
        for label, bandwidth, latency in INTERCONNECTS:
            cells = []
            for n in NODES[1:]:
                step = compute + reduce_seconds(grad_bytes, n, bandwidth, latency)
                cells.append(f"{step * 1e3:.1f} ({100 * compute / step:.1f}%)")
            print(f"| {label} | " + " | ".join(cells) + " |")
        print()
        print(f"Strong scaling (the SPEC batch of {rows} rows cut over the nodes; compute "
              "assumed proportional to rows), InfiniBand EDR. Step ms (speed-up):\n")
        label, bandwidth, latency = INTERCONNECTS[3]
        usable = [n for n in NODES[1:] if n <= rows]
        print("| | " + " | ".join(f"{n} nodes" for n in usable) + " |")
        print("|---|" + "---|" * len(usable))
        cells = []
        for n in usable:
            step = compute * math.ceil(rows / n) / rows + reduce_seconds(grad_bytes, n,
                                                                         bandwidth, latency)
            cells.append(f"{step * 1e3:.1f} ({compute / step:.1f}x)")
        print("| step | " + " | ".join(cells) + " |\n")


if __name__ == "__main__":
    main()
