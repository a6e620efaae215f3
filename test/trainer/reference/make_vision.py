#!/usr/bin/python3
"""Writes vision_parity.h5: a tiny vision-language model -- a Llama-family decoder whose placeholder tokens'
embeddings are replaced by the features of a ViT encoder and projector -- written here in plain PyTorch after
Hugging Face transformers' SiglipVisionTransformer (patch convolution with a bias, a learned position per
patch, pre-norm blocks of bidirectional attention and a tanh-GELU MLP, a final LayerNorm over every patch) and
LlavaMultiModalProjector (Linear, GELU, Linear; here the tanh GELU) and modeling_llama (transformers is not
imported), from fixed initial weights, with its inputs, logits, loss and every parameter gradient.

The batch: row 0 holds two pictures (at positions 3 and 27) among text, row 1 is text only; the loss is on
text only (weight 0 at the pictures' positions and where the target is a picture's placeholder), as the
reader's loss mask makes it.

Layout: attributes hold the configuration (int64 / float64); datasets init/<param>, tokens [B, T] and targets
[B, T] (int32), weights [B, T] (float32), pictures [n, S, S, 3] (uint8, RGB), picture_starts [n] (int64, flat
position row x T + t), logits [B, T, V], loss [1] (sum of weight x cross-entropy / sum of weights),
grad/<param> (of loss). The llava/ group holds logits, loss and grad/<param> of the same model in LLaVA's
arrangement: no final norm (vision.post_norm off; its weights unused) and the encoder's LayerNorms at
epsilon llava_norm_eps (an attribute; SigLIP's 1e-6).

Pixels enter as SigLIP's processor leaves them: x / 255 normalised by mean 0.5 and std 0.5. The patch
embedding is a convolution here, a product over flattened patches in C++: the two must agree on the patch
layout. Precision as make_families.py: float32 weights and inputs, the model in float64, results stored as
float32 (the loss as float64). Every run writes the same bytes.

Run with Debian's torch:  /usr/bin/python3 test/trainer/reference/make_vision.py
"""
import math, os
import h5py, numpy as np, torch, torch.nn.functional as F

torch.set_num_threads(1)
torch.set_default_dtype(torch.float64)

CFG = dict(layers=2, d_model=32, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=48, batch=2, ffn_hidden=96,
           norm_eps=1e-5, rope_theta=1e4, vision_layers=2, image_size=16, patch=4, vision_width=24,
           vision_heads=2, vision_mlp_hidden=48, projector_hidden=40, placeholder=63)
STARTS = [(0, 3), (0, 27)]  # (row, position) of each picture
SEED = 20261206
LN_EPS = 1e-5
LLAVA_EPS = 1e-6  # SigLIP's LayerNorm epsilon, in the llava/ variant


def param_shapes(c):
    C, NH, KV, hd, V, L = c["d_model"], c["heads"], c["kv_heads"], c["head_dim"], c["vocab"], c["layers"]
    W, H, P = c["vision_width"], c["vision_mlp_hidden"], c["projector_hidden"]
    T = (c["image_size"] // c["patch"]) ** 2
    s = {"wte.weight": (V, C)}
    s["vision.patch.weight"] = (W, 3 * c["patch"] ** 2); s["vision.patch.bias"] = (W,)
    s["vision.pos.weight"] = (T, W)
    for i in range(c["vision_layers"]):
        b = f"vision.blocks.{i}."
        s[b + "ln1.weight"] = (W,); s[b + "ln1.bias"] = (W,)
        s[b + "attn.qkv.weight"] = (3 * W, W); s[b + "attn.qkv.bias"] = (3 * W,)
        s[b + "attn.proj.weight"] = (W, W); s[b + "attn.proj.bias"] = (W,)
        s[b + "ln2.weight"] = (W,); s[b + "ln2.bias"] = (W,)
        s[b + "mlp.fc.weight"] = (H, W); s[b + "mlp.fc.bias"] = (H,)
        s[b + "mlp.proj.weight"] = (W, H); s[b + "mlp.proj.bias"] = (W,)
    s["vision.ln_post.weight"] = (W,); s["vision.ln_post.bias"] = (W,)
    s["projector.fc1.weight"] = (P, W); s["projector.fc1.bias"] = (P,)
    s["projector.fc2.weight"] = (C, P); s["projector.fc2.bias"] = (C,)
    for i in range(L):
        b = f"blocks.{i}."
        s[b + "ln1.weight"] = (C,)
        s[b + "attn.q.weight"] = (NH * hd, C); s[b + "attn.k.weight"] = (KV * hd, C)
        s[b + "attn.v.weight"] = (KV * hd, C); s[b + "attn.proj.weight"] = (C, NH * hd)
        s[b + "ln2.weight"] = (C,)
        s[b + "mlp.gate_up.weight"] = (2 * c["ffn_hidden"], C); s[b + "mlp.down.weight"] = (C, c["ffn_hidden"])
    s["lnf.weight"] = (C,)
    s["head.weight"] = (V, C)
    return s


def initial(c, gen):
    """float32 initial weights. Matrices N(0, 0.02) but: q/k (both towers) N(0, 0.25), so that attention is far
    from uniform and its mask matters; the patch embedding N(0, 0.1) and the projector N(0, 0.15), so that the
    pictures' features are as large as the token embeddings (N(0, 0.05)); the head N(0, 0.2). Norm weights
    1 + 0.1 N, biases 0.02 N. Matrices rounded to multiples of a power of two near std / 8."""
    out = {}
    for name, shape in param_shapes(c).items():
        n = torch.randn(shape, generator=gen, dtype=torch.float32)
        if "ln" in name and name.endswith(".weight"):
            w = 1 + 0.1 * n
        elif name.endswith(".bias"):
            w = 0.02 * n
        else:
            std = 0.02
            if name == "wte.weight": std = 0.05
            elif name == "head.weight": std = 0.2
            elif "attn.q." in name or "attn.k." in name: std = 0.25
            elif name.startswith("vision.patch"): std = 0.1
            elif name.startswith("projector."): std = 0.15
            step = 2.0 ** math.floor(math.log2(std / 8))
            w = torch.round(std * n / step) * step
            if "attn.qkv.weight" in name:  # the vision q and k rows larger, as the LM's
                W = shape[1]
                w[: 2 * W] = torch.round(0.25 * n[: 2 * W] / (2.0 ** -5)) * 2.0 ** -5
        out[name] = w.float()
    return out


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def gelu(x):
    return F.gelu(x, approximate="tanh")


def vision_features(c, p, pixels, causal=False):
    """SigLIP's vision transformer and LLaVA's projector: pixels [n, S, S, 3] uint8 -> [n, T, d_model]. The
    LayerNorms' epsilon is c["vision_norm_eps"] (default LN_EPS); without vision.ln_post in p the projector
    reads the last block's output (LLaVA's vision_feature_layer -1)."""
    eps = c.get("vision_norm_eps", LN_EPS)
    layer_norm = lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, eps)
    W, heads, k = c["vision_width"], c["vision_heads"], c["patch"]
    hd = W // heads
    x = torch.as_tensor(pixels).double().permute(0, 3, 1, 2) / 255.0
    x = (x - 0.5) / 0.5
    w = p["vision.patch.weight"].view(W, 3, k, k)
    x = F.conv2d(x, w, p["vision.patch.bias"], stride=k)  # [n, W, G, G]
    x = x.flatten(2).transpose(1, 2) + p["vision.pos.weight"]  # [n, T, W]
    n, T, _ = x.shape
    for i in range(c["vision_layers"]):
        b = f"vision.blocks.{i}."
        h = layer_norm(x, p[b + "ln1.weight"], p[b + "ln1.bias"])
        qkv = h @ p[b + "attn.qkv.weight"].t() + p[b + "attn.qkv.bias"]
        q, kk, v = (t.view(n, T, heads, hd).transpose(1, 2) for t in qkv.split(W, dim=-1))
        s = q @ kk.transpose(-1, -2) / math.sqrt(hd)
        if causal:
            s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(n, T, W)
        x = x + a @ p[b + "attn.proj.weight"].t() + p[b + "attn.proj.bias"]
        h = layer_norm(x, p[b + "ln2.weight"], p[b + "ln2.bias"])
        x = x + gelu(h @ p[b + "mlp.fc.weight"].t() + p[b + "mlp.fc.bias"]) @ p[b + "mlp.proj.weight"].t() \
            + p[b + "mlp.proj.bias"]
    if "vision.ln_post.weight" in p:
        x = layer_norm(x, p["vision.ln_post.weight"], p["vision.ln_post.bias"])
    h = gelu(x @ p["projector.fc1.weight"].t() + p["projector.fc1.bias"])
    return h @ p["projector.fc2.weight"].t() + p["projector.fc2.bias"]


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_logits(c, p, embeds):
    """modeling_llama from inputs_embeds [B, T, C]: rotary positions 0..T-1, causal grouped-query attention."""
    B, T, C = embeds.shape
    NH, KV, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["norm_eps"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).double() / hd))
    freqs = torch.arange(T).double()[:, None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = embeds
    for i in range(c["layers"]):
        b = f"blocks.{i}."
        h = rms_norm(x, p[b + "ln1.weight"], eps)
        q = (h @ p[b + "attn.q.weight"].t()).view(B, T, NH, hd).transpose(1, 2)
        k = (h @ p[b + "attn.k.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ p[b + "attn.v.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(NH // KV, dim=1), v.repeat_interleave(NH // KV, dim=1)
        s = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(mask, float("-inf"))
        a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + a @ p[b + "attn.proj.weight"].t()
        h = rms_norm(x, p[b + "ln2.weight"], eps)
        g, u = (h @ p[b + "mlp.gate_up.weight"].t()).chunk(2, dim=-1)
        x = x + (F.silu(g) * u) @ p[b + "mlp.down.weight"].t()
    return rms_norm(x, p["lnf.weight"], eps) @ p["head.weight"].t()


def model_logits(c, p, tokens, pictures, causal_vision=False):
    embeds = p["wte.weight"][tokens.long()].clone()
    feats = vision_features(c, p, pictures, causal_vision)
    T = c["seq_len"]
    for k, (r, t) in enumerate(STARTS):
        embeds[r, t: t + feats.shape[1]] = feats[k]
    return llama_logits(c, p, embeds)


def main():
    c = CFG
    gen = torch.Generator().manual_seed(SEED)
    init = initial(c, gen)
    B, T, V, S = c["batch"], c["seq_len"], c["vocab"], c["image_size"]
    n_tok = (S // c["patch"]) ** 2
    tokens = torch.randint(0, V - 1, (B, T), generator=gen, dtype=torch.int32)
    for r, t in STARTS:
        tokens[r, t: t + n_tok] = c["placeholder"]
    targets = torch.cat((tokens[:, 1:], torch.randint(0, V - 1, (B, 1), generator=gen, dtype=torch.int32)), 1)
    weights = ((tokens != c["placeholder"]) & (targets != c["placeholder"])).float()
    pictures = torch.randint(0, 256, (len(STARTS), S, S, 3), generator=gen, dtype=torch.int32).to(torch.uint8)

    def run(c, init):
        p = {k: v.double().requires_grad_(True) for k, v in init.items()}
        logits = model_logits(c, p, tokens, pictures.numpy())
        ce = F.cross_entropy(logits.view(-1, V), targets.long().view(-1), reduction="none")
        w = weights.double().view(-1)
        loss = (ce * w).sum() / w.sum()
        loss.backward()
        return p, logits, loss

    p, logits, loss = run(c, init)
    # LLaVA's arrangement (vision.post_norm off, SigLIP's epsilon): the same weights without the final norm.
    llava_init = {k: v for k, v in init.items() if not k.startswith("vision.ln_post.")}
    llava_p, llava_logits, llava_loss = run(dict(c, vision_norm_eps=LLAVA_EPS), llava_init)

    # Every part must move the logits: the pictures' features, and the encoder's attention being bidirectional.
    with torch.no_grad():
        q = {k: v.detach() for k, v in p.items()}
        scale = logits.detach().abs().max()
        blind = dict(q, **{"projector.fc2.weight": torch.zeros_like(q["projector.fc2.weight"]),
                           "projector.fc2.bias": torch.zeros_like(q["projector.fc2.bias"])})
        moved_pictures = (model_logits(c, blind, tokens, pictures.numpy()) - logits).abs().max() / scale
        moved_mask = (model_logits(c, q, tokens, pictures.numpy(), True) - logits).abs().max() / scale
        print(f"pictures move the logits by {moved_pictures:.3g}, a causal encoder by {moved_mask:.3g}")
        assert moved_pictures > 5e-2 and moved_mask > 1e-2
        # The text-only row does not see the pictures.
        assert (model_logits(c, blind, tokens, pictures.numpy())[1] - logits[1]).abs().max() == 0

    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vision_parity.h5")
    with h5py.File(out, "w", libver=("earliest", "v110"), track_order=False) as f:
        for k, v in c.items():
            f.attrs[k] = np.float64(v) if isinstance(v, float) else np.int64(v)
        def put(name, array):
            array = np.ascontiguousarray(array)
            kw = dict(compression="gzip", compression_opts=9, shuffle=True) if array.size > 64 else {}
            f.create_dataset(name, data=array, chunks=array.shape if array.size > 64 else None, **kw)
        for k, v in init.items():
            put("init/" + k, v.numpy())
            put("grad/" + k, p[k].grad.float().numpy())
        put("tokens", tokens.numpy())
        put("targets", targets.numpy())
        put("weights", weights.numpy())
        put("pictures", pictures.numpy())
        put("picture_starts", np.array([r * T + t for r, t in STARTS], dtype=np.int64))
        put("logits", logits.detach().float().numpy())
        put("loss", np.array([loss.item()], dtype=np.float64))
        f.attrs["llava_norm_eps"] = np.float64(LLAVA_EPS)
        for k in llava_init:
            put("llava/grad/" + k, llava_p[k].grad.float().numpy())
        put("llava/logits", llava_logits.detach().float().numpy())
        put("llava/loss", np.array([llava_loss.item()], dtype=np.float64))
    print(f"wrote {out}: loss {loss.item():.6f}, without the final norm {llava_loss.item():.6f}")


if __name__ == "__main__":
    main()
