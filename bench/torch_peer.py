#!/usr/bin/python3
"""The workloads of bench/SPEC.md in PyTorch: the peer `stillpoint bench` is compared with.

    /usr/bin/python3 bench/torch_peer.py w1|w2|w3|w4 [--model implicit|explicit] [--iters K]
        [--threads 2] [--steps 20] [--warmup 3] [--json] [--weights FILE] [--dtype float32]
        [--zero-state full|row] [--record-last]
    /usr/bin/python3 bench/torch_peer.py scale --length T --batch B --depth D
        [--model implicit|explicit] [--threads 2] [--steps 5] [--warmup 1] [--json]
    /usr/bin/python3 bench/torch_peer.py export FILE

W1/W2 are written the way DEQ code in PyTorch is usually written: the forward Anderson solve
runs under torch.no_grad(), then f is evaluated once more with the tape on at z* (a leaf that
requires grad); a hook on that result solves the adjoint equation w = g + J^T w by plain
fixed-point iteration, each iteration one torch.autograd.grad VJP through the recorded f, and
returns w, which autograd then pushes through f into the parameters and the injection. The
explicit model is ordinary autograd through 6 cells. W4 (EnergyModel) solves its EM map the
same way: 16 plain iterations under no_grad, one recorded evaluation at v*, and a hook that runs
16 adjoint VJPs. The optimizer is torch.optim.AdamW.

Two options make the peer do the work stillpoint does, so that the two sides' per-op speed can be
told apart from work stillpoint skips: --zero-state row computes the attention of a cell at z = 0
(the explicit model's first cell, the implicit solver's first evaluation) as the one row it equals,
and --record-last (implicit) records the solver's last evaluation and uses it as the evaluation at
z* when z* is that iterate, instead of evaluating f there a second time.

Anderson is the same algorithm as stillpoint's (type II, differences of iterates and residuals
in a ring of m columns, Tikhonov lambda * trace(H) / m, mixing beta, the per-sample iterate
with the lowest relative residual returned), batched over samples with bmm, so that the two
sides compute the same function and the loss-agreement check is meaningful.

`scale` is the W1 model at another shape, the peer of `stillpoint bench scale`: sequence length
T, batch B, and depth D (explicit: D cells; implicit: D forward and D adjoint iterations). Its
report adds base_rss_mb, the resident set before the model is built.

`export FILE` writes a tiny configuration (the shapes of tests/data/deq_tiny.json) with
initial weights (W as [in, out]) and a fixed batch, plus this side's loss before and after one
AdamW step in float32 and float64, for `stillpoint bench w1 --weights FILE` to reproduce.

Output: one line per run (or one JSON object with --json), in the format of stillpoint bench,
after a line that says which BLAS library and kernel torch ran with.
"""

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- workloads

W1 = dict(V=16, B=32, T=32, d=64, heads=4, hidden=128, layers=6)
W2 = dict(W1, B=8, T=256)
TINY = dict(V=7, B=3, T=5, d=8, heads=2, hidden=12, layers=6)

W3_PATTERNS = 1024
W3_DIM = 64
W3_BETA = 32.0
W3_TOLERANCE = 1e-6
REL_EPSILON = 1e-9  # the relative residual's denominator guard (stillpoint's default)

ANDERSON_MEMORY = 5
ANDERSON_LAMBDA = 1e-4
ANDERSON_BETA = 1.0


def cell_names(prefix):
    names = []
    for p in ("wq", "wk", "wv", "wo"):
        names += [f"{prefix}{p}.weight", f"{prefix}{p}.bias"]
    names += [f"{prefix}ln1.gain", f"{prefix}ln1.bias", f"{prefix}fc1.weight", f"{prefix}fc1.bias",
              f"{prefix}fc2.weight", f"{prefix}fc2.bias", f"{prefix}ln2.gain", f"{prefix}ln2.bias"]
    return names


def init_params(cfg, kind, dtype, seed):
    """Parameters named as stillpoint names them, W as [in, out]: embeddings N(0, 1), weights
    U(-1/sqrt(in), 1/sqrt(in)), biases 0, layer-norm gains 1."""
    gen = torch.Generator().manual_seed(seed)
    V, T, d, hidden = cfg["V"], cfg["T"], cfg["d"], cfg["hidden"]

    def uniform(fan_in, shape):
        bound = 1.0 / math.sqrt(fan_in)
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound

    p = {
        "tok_emb": torch.randn(V, d, generator=gen, dtype=torch.float64),
        "pos_emb": torch.randn(T, d, generator=gen, dtype=torch.float64),
        "lnf.gain": torch.ones(d, dtype=torch.float64),
        "lnf.bias": torch.zeros(d, dtype=torch.float64),
        "out.weight": uniform(d, (d, V)),
        "out.bias": torch.zeros(V, dtype=torch.float64),
    }
    prefixes = ["cell."] if kind == "implicit" else [f"cells.{l}." for l in range(cfg["layers"])]
    for prefix in prefixes:
        for name in cell_names(prefix):
            leaf = name[len(prefix):]
            if leaf.endswith(".gain"):
                p[name] = torch.ones(d, dtype=torch.float64)
            elif leaf.endswith(".bias"):
                width = hidden if leaf == "fc1.bias" else d
                p[name] = torch.zeros(width, dtype=torch.float64)
            elif leaf == "fc1.weight":
                p[name] = uniform(d, (d, hidden))
            elif leaf == "fc2.weight":
                p[name] = uniform(hidden, (hidden, d))
            else:
                p[name] = uniform(d, (d, d))
    return {k: v.to(dtype).requires_grad_() for k, v in p.items()}


def init_energy_params(cfg, dtype, seed):
    """W4's parameters, named as stillpoint's energy kind names them (block.layer.* is the
    probabilistic attention, block.norm its input layer norm), W as [in, out], initialised as
    init_params does. The precisions are constants: log alpha = log(1/sqrt(dh)),
    log beta = log(1/dh)."""
    gen = torch.Generator().manual_seed(seed)
    V, T, d, hidden, heads = cfg["V"], cfg["T"], cfg["d"], cfg["hidden"], cfg["heads"]
    dh = d // heads

    def uniform(fan_in, shape):
        bound = 1.0 / math.sqrt(fan_in)
        return (torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound

    p = {
        "tok_emb": torch.randn(V, d, generator=gen, dtype=torch.float64),
        "pos_emb": torch.randn(T, d, generator=gen, dtype=torch.float64),
        "lnf.gain": torch.ones(d, dtype=torch.float64),
        "lnf.bias": torch.zeros(d, dtype=torch.float64),
        "out.weight": uniform(d, (d, V)),
        "out.bias": torch.zeros(V, dtype=torch.float64),
        "block.layer.log_query_precision": torch.full((heads,), math.log(1 / math.sqrt(dh)),
                                                      dtype=torch.float64),
        "block.layer.log_value_precision": torch.full((heads,), math.log(1 / dh),
                                                      dtype=torch.float64),
    }
    for name in ("wq", "wk", "wv", "wo"):
        p[f"block.layer.{name}.weight"] = uniform(d, (d, d))
        p[f"block.layer.{name}.bias"] = uniform(d, (d,))
    p.update({
        "block.norm.gain": torch.ones(d, dtype=torch.float64),
        "block.norm.bias": torch.zeros(d, dtype=torch.float64),
        "ffn_ln.gain": torch.ones(d, dtype=torch.float64),
        "ffn_ln.bias": torch.zeros(d, dtype=torch.float64),
        "ffn.fc1.weight": uniform(d, (d, hidden)),
        "ffn.fc1.bias": torch.zeros(hidden, dtype=torch.float64),
        "ffn.fc2.weight": uniform(hidden, (hidden, d)),
        "ffn.fc2.bias": torch.zeros(d, dtype=torch.float64),
    })
    constant = ("block.layer.log_query_precision", "block.layer.log_value_precision")
    return {k: v.to(dtype).requires_grad_(k not in constant) for k, v in p.items()}


def reversal_batch(cfg, seed):
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, cfg["V"], (cfg["B"], cfg["T"]), generator=gen)
    return x, x.flip(1)


# ---------------------------------------------------------------- the model

def linear(x, w, b):
    """x [..., in] @ w [in, out] + b as one addmm over the folded rows."""
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[1])


def cell(p, pre, z, u, heads, zero_state=False):
    """The W1 cell: h = LN1(z + MHA(z) + u); f = LN2(h + W2 GELU(W1 h + b1) + b2).
    zero_state: z is zero, so MHA(z) is wo(bv) at every position, computed as one row."""
    B, T, d = z.shape
    dh = d // heads
    if zero_state:
        attn = linear(p[pre + "wv.bias"].view(1, d), p[pre + "wo.weight"], p[pre + "wo.bias"])
        return cell_after_attention(p, pre, None, attn.view(1, 1, d), u)

    def project(name):
        return linear(z, p[pre + name + ".weight"], p[pre + name + ".bias"]) \
            .view(B, T, heads, dh).transpose(1, 2)

    q, k, v = project("wq"), project("wk"), project("wv")
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(dh))
    o = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, T, d)
    attn = linear(o, p[pre + "wo.weight"], p[pre + "wo.bias"])
    return cell_after_attention(p, pre, z, attn, u)


def cell_after_attention(p, pre, z, attn, u):
    d = u.shape[-1]
    residual = attn + u if z is None else z + attn + u
    h = F.layer_norm(residual, (d,), p[pre + "ln1.gain"], p[pre + "ln1.bias"], 1e-5)
    ff = linear(F.gelu(linear(h, p[pre + "fc1.weight"], p[pre + "fc1.bias"]), approximate="tanh"),
                p[pre + "fc2.weight"], p[pre + "fc2.bias"])
    return F.layer_norm(h + ff, (d,), p[pre + "ln2.gain"], p[pre + "ln2.bias"], 1e-5)


def anderson(f, z0, iters, m=ANDERSON_MEMORY, lam=ANDERSON_LAMBDA, beta=ANDERSON_BETA,
             f_first=None, f_last=None):
    """Exactly `iters` Anderson iterations (type II) from z0 [B, ...], batched over samples.
    Returns the per-sample iterate with the lowest relative residual (z0 included).
    f_first, f_last: if given, used in place of f for the evaluation at z0 and for the last one."""
    shape = z0.shape
    B = shape[0]
    z = z0.reshape(B, -1).clone()
    n = z.shape[1]
    fz = (f_first or f)(z.view(shape)).reshape(B, -1)
    g = fz - z
    best_z = z.clone()
    best_rel = g.norm(dim=1) / (fz.norm(dim=1) + REL_EPSILON)
    dZ = z.new_zeros(B, m, n)
    dG = z.new_zeros(B, m, n)
    H = torch.zeros(B, m, m, dtype=torch.float64)
    count, head = 0, 0
    prev_z = prev_g = None
    for it in range(iters):
        if prev_z is not None:
            dZ[:, head] = z - prev_z
            dG[:, head] = g - prev_g
            count = min(count + 1, m)
            row = torch.bmm(dG[:, :count], dG[:, head].unsqueeze(2)).squeeze(2).double()
            H[:, head, :count] = row
            H[:, :count, head] = row
            head = (head + 1) % m
        prev_z, prev_g = z, g
        if count == 0:
            z = prev_z + beta * prev_g
        else:
            h = H[:, :count, :count]
            reg = lam * h.diagonal(dim1=1, dim2=2).sum(1) / count
            h = h + reg.view(B, 1, 1) * torch.eye(count, dtype=torch.float64)
            rhs = torch.bmm(dG[:, :count], prev_g.unsqueeze(2)).double()
            gamma = torch.linalg.solve(h, rhs).to(z.dtype)  # [B, count, 1]
            mix = dZ[:, :count] + beta * dG[:, :count]
            z = prev_z + beta * prev_g - torch.bmm(gamma.transpose(1, 2), mix).squeeze(1)
        fz = (f_last if f_last and it == iters - 1 else f)(z.view(shape)).reshape(B, -1)
        g = fz - z
        rel = g.norm(dim=1) / (fz.norm(dim=1) + REL_EPSILON)
        better = rel < best_rel
        best_rel = torch.where(better, rel, best_rel)
        best_z = torch.where(better.unsqueeze(1), z, best_z)
    return best_z.view(shape)


def attach_fixed_point_adjoint(f_star, z_star, iters):
    """The implicit backward of f_star = f(z_star): a hook on f_star replaces the incoming
    gradient g by the adjoint w <- g + J^T w from w = g, exactly `iters` VJPs through the recorded
    f, which autograd then pushes through f into its inputs. The hook holds f_star and z_star
    through a list it empties, so no reference cycle keeps the graph alive after the backward
    pass, and removes itself before its VJPs, which would otherwise call it again."""
    held = [f_star, z_star]

    def adjoint(g):
        f, z, handle = held
        held.clear()
        handle.remove()
        w = g
        for _ in range(iters):
            w = torch.autograd.grad(f, z, w, retain_graph=True)[0] + g
        return w

    held.append(f_star.register_hook(adjoint))


class Model:
    def __init__(self, cfg, kind, params, iters, zero_state_row=False, record_last=False):
        self.cfg, self.kind, self.p, self.iters = cfg, kind, params, iters
        self.zero_state_row = zero_state_row
        self.record_last = record_last

    def encode(self, x):
        cfg, p = self.cfg, self.p
        u = p["tok_emb"][x] + p["pos_emb"][: x.shape[1]]
        if self.kind == "explicit":
            z = torch.zeros_like(u)
            for l in range(cfg["layers"]):
                z = cell(p, f"cells.{l}.", z, u, cfg["heads"],
                         zero_state=self.zero_state_row and l == 0)
            return z
        f = lambda z: cell(p, "cell.", z, u, cfg["heads"])
        f_first = lambda z: cell(p, "cell.", z, u, cfg["heads"], zero_state=True)
        recorded = []  # [z leaf, f(z leaf)] of the solver's last evaluation (record_last)

        def f_last(z):
            with torch.enable_grad():
                leaf = z.detach().clone().requires_grad_()
                out = f(leaf)
            recorded[:] = [leaf, out]
            return out.detach()

        record_last = self.record_last and torch.is_grad_enabled()
        with torch.no_grad():
            z_star = anderson(f, torch.zeros_like(u), self.iters,
                              f_first=f_first if self.zero_state_row else None,
                              f_last=f_last if record_last else None)
        if recorded and recorded[1].requires_grad and torch.equal(recorded[0], z_star):
            z_star, f_star = recorded  # the solver's last evaluation is the one at z*
        else:
            z_star = z_star.requires_grad_()
            f_star = cell(p, "cell.", z_star, u, cfg["heads"])  # the one recorded evaluation
        if f_star.requires_grad:
            attach_fixed_point_adjoint(f_star, z_star, self.iters)
        return f_star

    def loss(self, x, y):
        p, d = self.p, self.cfg["d"]
        z = F.layer_norm(self.encode(x), (d,), p["lnf.gain"], p["lnf.bias"], 1e-5)
        logits = linear(z, p["out.weight"], p["out.bias"])
        return F.cross_entropy(logits.reshape(-1, self.cfg["V"]), y.reshape(-1))


class EnergyModel:
    """W4: e = E[x] + P[t]; a = LN(e); per head q, k, m; the EM map
    F(v) = softmax(alpha q k^T + beta v m^T) m from v0 = softmax(alpha q k^T) m, exactly `iters`
    plain iterations without a graph, then one recorded F(v*); the adjoint w = g + J^T w by
    exactly `iters` VJPs (a hook, as the implicit W1 model); y = e + concat(o) Wo + bo;
    y2 = y + FFN(LN(y)); logits = LN(y2) Wout + bout."""

    def __init__(self, cfg, params, iters):
        self.cfg, self.p, self.iters = cfg, params, iters

    def encode(self, x):
        cfg, p = self.cfg, self.p
        B, T = x.shape
        d, heads = cfg["d"], cfg["heads"]
        dh = d // heads
        e = p["tok_emb"][x] + p["pos_emb"][:T]
        a = F.layer_norm(e, (d,), p["block.norm.gain"], p["block.norm.bias"], 1e-5)

        def project(name):
            return linear(a, p[f"block.layer.{name}.weight"], p[f"block.layer.{name}.bias"]) \
                .view(B, T, heads, dh).transpose(1, 2)

        q, k, m = project("wq"), project("wk"), project("wv")
        alpha = p["block.layer.log_query_precision"].detach().exp().view(1, heads, 1, 1)
        beta = p["block.layer.log_value_precision"].detach().exp().view(1, heads, 1, 1)
        scores = alpha * torch.matmul(q, k.transpose(-1, -2))  # fixed across iterations

        def em(v, scores, m):
            logits = scores + beta * torch.matmul(v, m.transpose(-1, -2))
            return torch.matmul(torch.softmax(logits, dim=-1), m)

        with torch.no_grad():
            v = torch.matmul(torch.softmax(scores, dim=-1), m)
            for _ in range(self.iters):
                v = em(v, scores, m)
        v_star = v.requires_grad_() if torch.is_grad_enabled() else v
        o = em(v_star, scores, m)  # the one recorded evaluation
        if o.requires_grad:
            attach_fixed_point_adjoint(o, v_star, self.iters)
        merged = o.transpose(1, 2).reshape(B, T, d)
        y = e + linear(merged, p["block.layer.wo.weight"], p["block.layer.wo.bias"])
        h = F.layer_norm(y, (d,), p["ffn_ln.gain"], p["ffn_ln.bias"], 1e-5)
        ff = linear(F.gelu(linear(h, p["ffn.fc1.weight"], p["ffn.fc1.bias"]), approximate="tanh"),
                    p["ffn.fc2.weight"], p["ffn.fc2.bias"])
        return y + ff

    def loss(self, x, y):
        p, d = self.p, self.cfg["d"]
        z = F.layer_norm(self.encode(x), (d,), p["lnf.gain"], p["lnf.bias"], 1e-5)
        logits = linear(z, p["out.weight"], p["out.bias"])
        return F.cross_entropy(logits.reshape(-1, self.cfg["V"]), y.reshape(-1))


def make_optimizer(params):
    # As stillpoint's AdamW: no weight decay on biases and layer-norm gains; constants (W4's
    # precisions) are not optimised.
    params = {k: v for k, v in params.items() if v.requires_grad}
    decay = [v for k, v in params.items() if not k.endswith((".bias", ".gain"))]
    no_decay = [v for k, v in params.items() if k.endswith((".bias", ".gain"))]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-3, betas=(0.9, 0.999), eps=1e-8, foreach=True)


def step(model, optimizer, x, y):
    loss = model.loss(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_flops(cfg, kind, iters, zero_state_row=False, record_last=False):
    """The analytic FLOP count of the products this peer runs: TransformerStepFlops of
    bench_command.h with both options, else with the work stillpoint skips added: without
    zero_state_row the first cell (explicit) or the solver's first evaluation (implicit) in full
    (their attention over z0 = 0), without record_last one more evaluation at z*. With
    record_last the count assumes the recording is used, as it is when z* is the last iterate
    (every W2 step checked; W1 falls back to evaluating at z* in some steps)."""
    bt = cfg["B"] * cfg["T"]
    d = cfg["d"]
    feed_forward = 4.0 * bt * d * cfg["hidden"]
    linear_f = 8.0 * bt * d * d + feed_forward
    attention = 4.0 * bt * cfg["T"] * d
    f = linear_f + attention
    vjp_state = linear_f + 2 * attention
    vjp_all = 2 * linear_f + 2 * attention
    head = 6.0 * bt * d * cfg["V"]
    if kind == "explicit" and zero_state_row:
        return (cfg["layers"] - 1) * (f + vjp_all) + 3 * feed_forward + head
    if kind == "explicit":
        return cfg["layers"] * (f + vjp_all) + head
    evaluations = iters * f + (feed_forward if zero_state_row else f) + (0 if record_last else f)
    return evaluations + iters * vjp_state + vjp_all + head


# ---------------------------------------------------------------- W3

def energy_step_flops(cfg, iters):
    """TransformerStepFlops of bench_command.cc for W4."""
    bt = cfg["B"] * cfg["T"]
    d = cfg["d"]
    feed_forward = 4.0 * bt * d * cfg["hidden"]
    projections = 8.0 * bt * d * d
    em = 4.0 * bt * cfg["T"] * d
    head = 6.0 * bt * d * cfg["V"]
    return 3 * projections + em + (iters + 1) * em + iters * em + 2 * em + 3 * feed_forward + head


def retrieval_data(dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    scale = 1.0 / math.sqrt(W3_DIM)
    patterns = (torch.randint(0, 2, (W3_PATTERNS, W3_DIM), generator=gen) * 2 - 1).to(dtype) * scale
    zeroed = int(0.25 * W3_DIM)
    order = torch.rand(W3_PATTERNS, W3_DIM, generator=gen).argsort(dim=1)[:, :zeroed]
    queries = patterns.clone()
    queries.scatter_(1, order, 0.0)
    return patterns, queries


def hopfield_map(X, xi, beta):
    return torch.softmax(beta * (xi @ X.t()), dim=1) @ X


def retrieve_batch(X, Q, beta, max_iter):
    """What one writes first: iterate the whole batch until every query has converged.
    Returns (fixed points, per-query iterations, query evaluations)."""
    xi = Q.clone()
    fx = hopfield_map(X, xi, beta)
    iterations = torch.zeros(Q.shape[0], dtype=torch.long)
    done = torch.zeros(Q.shape[0], dtype=torch.bool)
    evaluations = Q.shape[0]
    for it in range(max_iter + 1):
        rel = (fx - xi).norm(dim=1) / (fx.norm(dim=1) + REL_EPSILON)
        done |= rel <= W3_TOLERANCE
        if bool(done.all()) or it == max_iter:
            break
        iterations += (~done).long()
        xi = fx
        fx = hopfield_map(X, xi, beta)
        evaluations += Q.shape[0]
    return xi, iterations, evaluations


def retrieve_active(X, Q, beta, max_iter):
    """Per-query exit: only the queries still above the tolerance are evaluated."""
    xi = Q.clone()
    fx = hopfield_map(X, xi, beta)
    iterations = torch.zeros(Q.shape[0], dtype=torch.long)
    active = torch.arange(Q.shape[0])
    evaluations = Q.shape[0]
    for it in range(max_iter + 1):
        cur = xi[active]
        rel = (fx - cur).norm(dim=1) / (fx.norm(dim=1) + REL_EPSILON)
        keep = rel > W3_TOLERANCE
        if it == max_iter or not bool(keep.any()):
            break
        active, fx = active[keep], fx[keep]
        xi[active] = fx
        iterations[active] += 1
        fx = hopfield_map(X, xi[active], beta)
        evaluations += active.numel()
    return xi, iterations, evaluations


# ---------------------------------------------------------------- reporting

def blas_info():
    """Which BLAS library torch has loaded and, for OpenBLAS, its kernel (core) name."""
    path = None
    with open("/proc/self/maps") as maps:
        for line in maps:
            name = line.split()[-1] if len(line.split()) >= 6 else ""
            if "blas" in os.path.basename(name) and path is None:
                path = name
    core = None
    if path:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            core = lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            core = None
    blas_line = next((l.strip() for l in torch.__config__.show().splitlines()
                      if "BLAS_INFO" in l), "")
    blas_setting = next((s for s in blas_line.split(", ") if "BLAS_INFO" in s), "BLAS_INFO=?")
    return {"blas_library": os.path.realpath(path) if path else None, "openblas_core": core,
            "torch_build": blas_setting.split("BLAS_INFO=")[-1].strip(),
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
            "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES")}


def peak_rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def current_rss_bytes():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def quantile(sorted_values, q):
    pos = q * (len(sorted_values) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def report(args, result, out=sys.stdout):
    s = sorted(result["seconds"])
    r = {"framework": "torch", "workload": args.workload, "model": result.get("model"),
         "iters": result["iters"], "threads": args.threads, "steps": args.steps,
         "warmup": args.warmup, "dtype": args.dtype,
         "median_ms": 1e3 * quantile(s, 0.5), "min_ms": 1e3 * s[0], "max_ms": 1e3 * s[-1],
         "p25_ms": 1e3 * quantile(s, 0.25), "p75_ms": 1e3 * quantile(s, 0.75),
         "cpu_median_ms": 1e3 * statistics.median(result["cpu"]), "flops": result["flops"]}
    r["gflops_per_s"] = result["flops"] / (r["median_ms"] / 1e3) / 1e9
    r["peak_rss_mb"] = peak_rss_bytes() / (1 << 20)
    for key in ("loss_first", "loss_after_one_step", "loss_last", "accuracy", "queries",
                "iterations_mean", "iterations_max", "evaluations", "w3_mode", "base_rss_mb"):
        if key in result:
            r[key] = result[key]
    r.update(blas_info())
    r["torch"] = torch.__version__
    if args.json:
        print(json.dumps(r), file=out)
        return
    info = blas_info()
    print(f"peer: torch {torch.__version__}, BLAS {info['blas_library']} "
          f"(OpenBLAS core {info['openblas_core']}), torch build BLAS_INFO={info['torch_build']}, "
          f"OPENBLAS_CORETYPE={info['OPENBLAS_CORETYPE']}, "
          f"GLIBC_TUNABLES={info['GLIBC_TUNABLES']}", file=out)
    name = f"{args.workload} {r['model']}" if r["model"] else args.workload
    print(f"torch {name} (K={r['iters']}, threads {args.threads}, {args.dtype}): median "
          f"{r['median_ms']:.3f} ms (min {r['min_ms']:.3f}, max {r['max_ms']:.3f}, IQR "
          f"{r['p25_ms']:.3f}-{r['p75_ms']:.3f}) over {args.steps} "
          f"{'steps' if r['model'] else 'runs'} after {args.warmup} warm-up; "
          f"CPU {r['cpu_median_ms']:.3f} ms; "
          f"{r['flops'] / 1e9:.3f} GFLOP, {r['gflops_per_s']:.1f} GFLOP/s; "
          f"peak RSS {r['peak_rss_mb']:.1f} MiB", file=out)
    if "loss_first" in r:
        after = r["loss_after_one_step"]
        print(f"  loss: first {r['loss_first']:.6f}, after one step "
              f"{after if after is None else f'{after:.6f}'}, last {r['loss_last']:.6f}", file=out)
    if "accuracy" in r:
        print(f"  accuracy {r['accuracy']:.4f} over {r['queries']} queries ({r['w3_mode']}); "
              f"iterations mean {r['iterations_mean']:.2f}, max {r['iterations_max']}; "
              f"{r['evaluations']} query evaluations", file=out)


# ---------------------------------------------------------------- runs

def load_weights(path, kind, dtype):
    with open(path) as f:
        data = json.load(f)
    c = data["config"]
    cfg = dict(V=c["V"], B=c["B"], T=c["T"], d=c["d"], heads=c["heads"], hidden=c["hidden"],
               layers=data["explicit"]["n_layers"] if kind == "explicit" else 1)
    constant = ("block.layer.log_query_precision", "block.layer.log_value_precision")
    params = {k: torch.tensor(v["data"], dtype=torch.float64).view(v["shape"]).to(dtype)
              .requires_grad_(k not in constant) for k, v in data[kind]["params"].items()}
    x = torch.tensor(data["x"], dtype=torch.long)
    y = torch.tensor(data["y"], dtype=torch.long)
    return cfg, params, x, y


def make_model(cfg, kind, params, iters, zero_state_row=False, record_last=False):
    if kind == "energy":
        return EnergyModel(cfg, params, iters)
    return Model(cfg, kind, params, iters, zero_state_row, record_last)


def run_transformer(args, dtype):
    kind = "energy" if args.workload == "w4" else args.model or "implicit"
    iters = args.iters or 16
    base_rss = current_rss_bytes()
    if args.workload == "scale":
        cfg = dict(W1, T=args.length, B=args.batch, layers=args.depth)
        iters = args.depth
        params = init_params(cfg, kind, dtype, args.seed)
        x, y = reversal_batch(cfg, args.seed)
    elif args.weights:
        cfg, params, x, y = load_weights(args.weights, kind, dtype)
    else:
        cfg = W2 if args.workload == "w2" else W1
        params = (init_energy_params(cfg, dtype, args.seed) if kind == "energy"
                  else init_params(cfg, kind, dtype, args.seed))
        x, y = reversal_batch(cfg, args.seed)
    model = make_model(cfg, kind, params, iters, args.zero_state == "row", args.record_last)
    optimizer = make_optimizer(params)
    losses, seconds, cpu = [], [], []
    for i in range(args.warmup + args.steps):
        cpu_start = time.process_time()
        start = time.perf_counter()
        losses.append(step(model, optimizer, x, y))
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            seconds.append(elapsed)
            cpu.append(time.process_time() - cpu_start)
    return {"model": kind, "iters": iters, "seconds": seconds, "cpu": cpu,
            "flops": (energy_step_flops(cfg, iters) if kind == "energy" else
                      step_flops(cfg, kind, iters, args.zero_state == "row", args.record_last)),
            "loss_first": losses[0],
            "loss_after_one_step": losses[1] if len(losses) > 1 else None,
            "loss_last": losses[-1], "base_rss_mb": base_rss / (1 << 20)}


def run_retrieval(args, dtype):
    max_iter = args.iters or 32
    X, Q = retrieval_data(dtype, args.seed)
    solve = retrieve_active if args.w3_mode == "active" else retrieve_batch
    seconds, cpu = [], []
    for i in range(args.warmup + args.steps):
        cpu_start = time.process_time()
        start = time.perf_counter()
        xi, iterations, evaluations = solve(X, Q, W3_BETA, max_iter)
        elapsed = time.perf_counter() - start
        if i >= args.warmup:
            seconds.append(elapsed)
            cpu.append(time.process_time() - cpu_start)
    nearest = (xi @ X.t()).argmax(dim=1)
    accuracy = (nearest == torch.arange(W3_PATTERNS)).double().mean().item()
    return {"model": None, "iters": max_iter, "seconds": seconds, "cpu": cpu,
            "flops": 4.0 * W3_PATTERNS * W3_DIM * evaluations, "accuracy": accuracy,
            "queries": W3_PATTERNS, "iterations_mean": iterations.double().mean().item(),
            "iterations_max": int(iterations.max()), "evaluations": evaluations,
            "w3_mode": args.w3_mode}


def export(path, seed):
    """Tiny shared configuration: weights, batch, and this side's losses."""
    cfg = TINY
    x, y = reversal_batch(cfg, seed)
    data = {"about": "initial weights and batch of the SPEC W1 model at a tiny size, exported by "
                     "bench/torch_peer.py; linear layers are y = x @ W + b with W of shape "
                     "(in, out); 'peer' holds torch's loss before and after one AdamW step "
                     "(Anderson and the adjoint iteration for exactly 16 iterations).",
            "config": {k: cfg[k] for k in ("V", "T", "B", "d", "heads", "hidden")},
            "x": x.tolist(), "y": y.tolist(), "peer": {}}
    for kind in ("implicit", "explicit", "energy"):
        params = (init_energy_params(cfg, torch.float64, seed) if kind == "energy"
                  else init_params(cfg, kind, torch.float64, seed))
        data[kind] = {"params": {k: {"shape": list(v.shape),
                                     "data": v.detach().reshape(-1).tolist()}
                                 for k, v in params.items()}}
        if kind == "explicit":
            data[kind]["n_layers"] = cfg["layers"]
    with open(path, "w") as f:
        json.dump(data, f)
    for kind in ("implicit", "explicit", "energy"):
        for dtype_name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
            _, params, xx, yy = load_weights(path, kind, dtype)
            model = make_model(cfg, kind, params, 16)
            optimizer = make_optimizer(params)
            first = step(model, optimizer, xx, yy)
            after = step(model, optimizer, xx, yy)
            data["peer"][f"{kind}_{dtype_name}"] = {"loss_first": first,
                                                    "loss_after_one_step": after}
    with open(path, "w") as f:
        json.dump(data, f)
    print(json.dumps(data["peer"]))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=["w1", "w2", "w3", "w4", "scale", "export"])
    parser.add_argument("path", nargs="?", help="export: the file to write")
    parser.add_argument("--model", choices=["implicit", "explicit", "energy"])
    parser.add_argument("--iters", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--weights")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--w3-mode", choices=["batch", "active"], default="batch",
                        help="w3: iterate the whole batch until all converge, or only the "
                             "queries still above the tolerance")
    parser.add_argument("--zero-state", choices=["full", "row"], default="full",
                        help="compute the attention of a cell at z = 0 (explicit: the first "
                             "cell; implicit: the solver's first evaluation) in full, as autograd "
                             "code does, or as the one row it equals, as stillpoint does (for "
                             "comparing the two sides' per-op cost alone)")
    parser.add_argument("--record-last", action="store_true",
                        help="implicit model: record the solver's last evaluation and use it at "
                             "z* when z* is that iterate, as stillpoint does, instead of "
                             "evaluating f at z* once more")
    parser.add_argument("--length", type=int, help="scale: sequence length T")
    parser.add_argument("--batch", type=int, help="scale: batch B")
    parser.add_argument("--depth", type=int,
                        help="scale: explicit cells, or implicit forward and adjoint iterations")
    args = parser.parse_args()
    scale_args = (args.length, args.batch, args.depth)
    if args.workload == "scale":
        if any(v is None or v < 1 for v in scale_args):
            parser.error("scale needs --length, --batch and --depth, each >= 1")
        if args.iters or args.weights or args.model == "energy":
            parser.error("scale: --iters (the depth is --depth), --weights and --model energy "
                         "do not apply")
    elif any(v is not None for v in scale_args):
        parser.error("--length, --batch and --depth apply to scale only")
    if args.iters < 0 or args.threads < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--iters >= 0, --threads >= 1, --steps >= 1 and --warmup >= 0 are required")
    if args.workload == "w4" and args.model not in (None, "energy"):
        parser.error("w4 is the energy-attention model; --model does not apply")
    if args.record_last and args.model == "explicit":
        parser.error("--record-last applies to the implicit model only")
    torch.set_num_threads(args.threads)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    if args.workload == "export":
        if not args.path:
            parser.error("export needs a file name")
        export(args.path, args.seed)
        return
    if args.workload == "w3":
        if args.model or args.weights:
            parser.error("--model and --weights do not apply to w3")
        result = run_retrieval(args, dtype)
    else:
        result = run_transformer(args, dtype)
    report(args, result)


if __name__ == "__main__":
    main()
