#!/usr/bin/python3
"""Writes moe_parity.h5: a Mixture-of-Experts FFN block (softmax router without bias, top-k routing with
un-renormalised gates, optional expert capacity with slot-major dropping, GELU-tanh experts, load-balancing
aux loss and router z loss) built plainly in PyTorch from fixed weights, with its outputs, losses and every
gradient, for four cases: top1_dropless, top2_dropless, top1_capacity, top2_capacity (same inputs and
weights in all). The C++ MoE block is checked against it.

Precision: inputs and weights are drawn in float32 and stored as float32; the block is then computed in
float64 from exactly those float32 values (autograd in float64), and the results are stored as float32
(losses as float64 attributes), so the reference is more exact than the float32 C++ it checks.

Run with Debian's torch:  /usr/bin/python3 test/trainer/reference/make_moe_fixture.py
"""
import math, os
import h5py, numpy as np, torch, torch.nn.functional as F

N, C, E = 24, 16, 4
H = 4 * C
ALPHA, BETA = 1e-2, 1e-3
ROUTER_STD = 0.5  # Wr ~ N(0, 0.5^2): routing far from uniform, so capacity binds (asserted below)
CASES = [("top1_dropless", 1, 0.0), ("top2_dropless", 2, 0.0), ("top1_capacity", 1, 1.0),
         ("top2_capacity", 2, 1.0)]
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(20240615)


def draw(*shape, std=1.0):
    return torch.randn(*shape, generator=gen, dtype=torch.float32) * std


x0 = draw(N, C)
Wr0 = draw(E, C, std=ROUTER_STD)
W1_0 = draw(E, H, C, std=0.1); b1_0 = draw(E, H, std=0.1)
W2_0 = draw(E, C, H, std=0.1); b2_0 = draw(E, C, std=0.1)
G0 = draw(N, C)
G = G0.double()


def run(k, cf):
    x, Wr, W1, b1, W2, b2 = [t.double().requires_grad_(True) for t in (x0, Wr0, W1_0, b1_0, W2_0, b2_0)]
    logits = x @ Wr.t()                                    # [N, E]
    probs = logits.softmax(dim=1)
    lse = torch.logsumexp(logits, dim=1)
    # top-k, descending probability, ties to the lower expert index (stable sort keeps index order)
    order = torch.sort(probs.detach(), dim=1, descending=True, stable=True).indices
    idx = order[:, :k]                                     # [N, k]
    gates = probs.gather(1, idx)                           # [N, k], not renormalised
    # the choice must not hinge on float32 rounding: k-th and (k+1)-th probabilities well apart
    sp = probs.detach().gather(1, order)
    assert (sp[:, k - 1] - sp[:, k]).min().item() > 1e-4, "near-tie in top-k; change the seed"
    # capacity, slot-major priority: all slot-0 choices in token order, then slot 1, ...
    cap = math.ceil(cf * N * k / E) if cf > 0 else 0
    keep = torch.ones(N, k, dtype=torch.bool)
    count = [0] * E
    for j in range(k):
        for t in range(N):
            e = idx[t, j].item()
            if cap > 0 and count[e] >= cap:
                keep[t, j] = False
            else:
                count[e] += 1
    dropped = int((~keep).sum().item())
    out = torch.zeros(N, C, dtype=torch.float64)
    for t in range(N):
        for j in range(k):
            if not keep[t, j]: continue
            e = idx[t, j].item()
            h = F.gelu(W1[e] @ x[t] + b1[e], approximate="tanh")
            out = out.index_add(0, torch.tensor([t]), (gates[t, j] * (W2[e] @ h + b2[e]))[None])
    # aux loss: f_i from assignments before dropping (constant), P_i = mean prob of expert i
    f = torch.bincount(idx.reshape(-1), minlength=E).double() / (N * k)
    aux = ALPHA * E * (f * probs.mean(dim=0)).sum()
    z = BETA * (lse ** 2).mean()
    L = (out * G).sum() + aux + z
    L.backward()
    return dict(out=out.detach(), d_x=x.grad, d_router_weight=Wr.grad, d_fc_weight=W1.grad,
                d_fc_bias=b1.grad, d_proj_weight=W2.grad, d_proj_bias=b2.grad,
                tokens_per_expert=torch.tensor(count, dtype=torch.int32), expert_index=idx.int(),
                gates=gates.detach(), cap=cap, dropped=dropped, aux=aux.item(), z=z.item())


results = {name: run(k, cf) for name, k, cf in CASES}
for name, k, cf in CASES:
    if cf > 0: assert results[name]["dropped"] > 0, f"{name}: capacity drops nothing; raise ROUTER_STD"
    else: assert results[name]["dropped"] == 0

# The float32 payload alone is ~187 KB at these sizes; the newer (HDF5 1.10) format and lossless
# shuffle + deflate on the larger datasets keep the file under 200 KB. Both are transparent to H5Dread.
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_parity.h5")


def put(f, name, a):
    kw = dict(compression="gzip", compression_opts=9, shuffle=True) if a.size > 64 else {}
    f.create_dataset(name, data=a, track_times=False, **kw)


# No object timestamps anywhere (file, groups, datasets), so every run writes the same bytes.
fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
fcpl = h5py.h5p.create(h5py.h5p.FILE_CREATE); fcpl.set_obj_track_times(False)
gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE); gcpl.set_obj_track_times(False)
with h5py.File(h5py.h5f.create(path.encode(), h5py.h5f.ACC_TRUNC, fcpl=fcpl, fapl=fapl)) as f:
    for a, v in dict(N=N, C=C, H=H, E=E).items(): f.attrs[a] = np.int64(v)
    f.attrs["alpha"] = np.float64(ALPHA); f.attrs["beta"] = np.float64(BETA)
    for name, t in (("x", x0), ("dout", G0), ("router_weight", Wr0), ("fc_weight", W1_0), ("fc_bias", b1_0),
                    ("proj_weight", W2_0), ("proj_bias", b2_0)):
        put(f, name, t.numpy())
    for name, k, cf in CASES:
        r = results[name]; g = h5py.Group(h5py.h5g.create(f.id, name.encode(), gcpl=gcpl))
        g.attrs["top_k"] = np.int64(k); g.attrs["capacity_factor"] = np.float64(cf)
        g.attrs["capacity"] = np.int64(r["cap"]); g.attrs["dropped"] = np.int64(r["dropped"])
        g.attrs["aux_loss"] = np.float64(r["aux"]); g.attrs["z_loss"] = np.float64(r["z"])
        for d in ("out", "d_x", "d_router_weight", "d_fc_weight", "d_fc_bias", "d_proj_weight", "d_proj_bias",
                  "gates"):
            put(g, d, r[d].numpy().astype(np.float32))
        put(g, "tokens_per_expert", r["tokens_per_expert"].numpy().astype(np.int32))
        put(g, "expert_index", r["expert_index"].numpy().astype(np.int32))
print(f"wrote {path}")
for name, k, cf in CASES:
    r = results[name]
    print(f"  {name}: capacity {r['cap']}, dropped {r['dropped']}, tokens_per_expert "
          f"{r['tokens_per_expert'].tolist()}, aux {r['aux']:.6e}, z {r['z']:.6e}")
