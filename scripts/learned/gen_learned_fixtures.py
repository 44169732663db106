#!/usr/bin/env python3
"""Reference values and gradients for FIRE, CoPE and forgetting attention, in PyTorch.

Each bias is computed step by step as the papers' reference implementations
do it, with torch's own ops (so torch defines abs/clamp/gather/logsigmoid/
cumsum semantics and autograd the gradients), in float64:

- FIRE (Li et al. 2024, arXiv:2310.04418, appendix "FIRE implementation in
  PyTorch"): positions = arange(T); rel = i - j; threshold = |l_mult * L0|;
  normaliser = max(positions, threshold)[:, None]; u = log(|c*rel| + 1) /
  (log(|c*normaliser| + 1) + eps); bias = MLP(u) (Linear(1,W), ReLU,
  Linear(W,H)) permuted to (1, H, T, T). Every entry, j > i included.
- CoPE (Golovneva et al. 2024, facebookresearch/RAM projects/cope,
  ContextPosSelfAttn): gates = sigmoid(q k^T / sqrt(d)) * mask; positions =
  gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos-1); z = q @ pos_emb;
  z gathered at ceil/floor, interpolated with weight p - floor(p); the term
  is divided by sqrt(d) with the logits (the reference's default). Causal
  (mask = tril) and unmasked (mask = None, its encoder path).
- Forgetting attention (Lin et al. 2025, zhixuan-lin/forgetting-transformer):
  log_fgate = logsigmoid(Linear(D, H)(x)) as (B, H, T); c = cumsum(log_fgate);
  bias = c[:, :, P:, None] - c[:, :, None, :] for queries the last T - P keys.

The loss is sum(W * bias) with a fixed random W; its gradients with respect to
every parameter and input are stored. Usage:
    python scripts/learned/gen_learned_fixtures.py crates/posenc/tests/fixtures/learned_bias.json
"""

import json
import math
import sys

import torch

torch.set_default_dtype(torch.float64)


def tolist(t):
    return t.detach().tolist()


def fire_case(mode_seed, heads=3, width=5, c0=0.3, l0=6.5, l_mult0=1.1, t=10):
    g = torch.Generator().manual_seed(mode_seed)
    w1 = torch.randn(width, 1, generator=g).requires_grad_()
    b1 = torch.randn(width, generator=g).requires_grad_()
    w2 = (torch.randn(heads, width, generator=g) / math.sqrt(width)).requires_grad_()
    b2 = torch.randn(heads, generator=g).requires_grad_()
    c = torch.tensor(c0, requires_grad=True)
    l_mult = torch.tensor(l_mult0, requires_grad=True)
    eps = 1e-6

    positions = torch.arange(t, dtype=torch.float64)
    rel = positions[:, None] - positions[None, :]
    threshold = torch.abs(l_mult * l0)
    normaliser = torch.max(positions, threshold)[:, None]
    num = torch.log(torch.abs(c * rel) + 1)
    den = torch.log(torch.abs(c * normaliser) + 1) + eps
    u = (num / den).unsqueeze(-1)
    hidden = torch.relu(u @ w1.T + b1)
    out = hidden @ w2.T + b2  # (T, T, H)
    bias = out.permute(2, 0, 1).unsqueeze(0)  # (1, H, T, T)

    weight = torch.randn(bias.shape, generator=g)
    (bias * weight).sum().backward()
    return {
        "heads": heads,
        "width": width,
        "init_l": l0,
        "eps": eps,
        "t": t,
        "c": c0,
        "l_multiplier": l_mult0,
        "w1": tolist(w1.squeeze(1)),
        "b1": tolist(b1),
        "w2": tolist(w2),
        "b2": tolist(b2),
        "bias": tolist(bias[0]),
        "loss_weight": tolist(weight[0]),
        "grad": {
            "c": c.grad.item(),
            "l_multiplier": l_mult.grad.item(),
            "w1": tolist(w1.grad.squeeze(1)),
            "b1": tolist(b1.grad),
            "w2": tolist(w2.grad),
            "b2": tolist(b2.grad),
        },
    }


def cope_case(seed, causal, b=2, h=2, t=9, d=4, npos=5):
    g = torch.Generator().manual_seed(seed)
    q = (2.0 * torch.randn(b, h, t, d, generator=g)).requires_grad_()
    k = (2.0 * torch.randn(b, h, t, d, generator=g)).requires_grad_()
    pos_emb = torch.randn(1, d, npos, generator=g).requires_grad_()

    # Heads folded into the batch, as the reference's split_heads does.
    qf = q.reshape(b * h, t, d)
    kf = k.reshape(b * h, t, d)
    gates = torch.sigmoid(torch.bmm(qf, kf.transpose(-1, -2)) / math.sqrt(d))
    if causal:
        gates = gates * torch.ones(t, t).tril().unsqueeze(0)
    positions = gates.flip(-1).cumsum(dim=-1).flip(-1)
    positions = positions.clamp(max=npos - 1)
    pos_logits_fixed = torch.matmul(qf, pos_emb)
    ceil = positions.ceil().long()
    floor = positions.floor().long()
    z_ceil = pos_logits_fixed.gather(-1, ceil)
    z_floor = pos_logits_fixed.gather(-1, floor)
    w = positions - floor
    term = z_ceil * w + z_floor * (1 - w)
    bias = (term / math.sqrt(d)).reshape(b, h, t, t)

    weight = torch.randn(bias.shape, generator=g)
    (bias * weight).sum().backward()
    return {
        "causal": causal,
        "b": b,
        "h": h,
        "t": t,
        "d": d,
        "npos": npos,
        "q": tolist(q),
        "k": tolist(k),
        "table": tolist(pos_emb[0].T),  # [npos][d]
        "positions": tolist(positions.reshape(b, h, t, t)),
        "bias": tolist(bias),
        "loss_weight": tolist(weight),
        "grad": {
            "q": tolist(q.grad),
            "k": tolist(k.grad),
            "table": tolist(pos_emb.grad[0].T),
        },
    }


def fox_case(seed, b=2, t=8, d=4, h=3, p=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, d, generator=g).requires_grad_()
    weight_ = torch.randn(h, d, generator=g).requires_grad_()
    bias_ = torch.randn(h, generator=g).requires_grad_()
    fgate_logit = (x @ weight_.T + bias_).transpose(1, 2)  # (B, H, T)
    log_fgate = torch.nn.functional.logsigmoid(fgate_logit)
    c = torch.cumsum(log_fgate, dim=-1)
    bias = c[:, :, p:, None] - c[:, :, None, :]  # queries: keys p..T

    weight = torch.randn(bias.shape, generator=g)
    (bias * weight).sum().backward()
    return {
        "b": b,
        "t": t,
        "d": d,
        "h": h,
        "q_offset": p,
        "x": tolist(x),
        "weight": tolist(weight_),
        "bias_param": tolist(bias_),
        "log_forget": tolist(log_fgate),
        "cumulative": tolist(c),
        "bias": tolist(bias),
        "loss_weight": tolist(weight),
        "grad": {
            "x": tolist(x.grad),
            "weight": tolist(weight_.grad),
            "bias_param": tolist(bias_.grad),
        },
    }


def main():
    out = {
        "torch": torch.__version__,
        "generator": "scripts/learned/gen_learned_fixtures.py",
        "fire": fire_case(1),
        "cope": [cope_case(2, True), cope_case(3, False)],
        "forgetting": fox_case(4),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
        f.write("\n")


if __name__ == "__main__":
    main()
