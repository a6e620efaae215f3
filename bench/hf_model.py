#!/usr/bin/python3
"""Writes a Llama-shaped model with random weights in the Hugging Face layout (config.json +
model.safetensors, or shards with an index) for bench/hf_io.sh: N(0, 0.02) weights, ones for the norms,
written in chunks so the generator never holds the model.

usage: bench/hf_model.py OUT_DIR [--layers 9] [--d-model 2048] [--dtype bf16|f32] [--shards 1]
"""
import argparse, json, os, struct
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=9)
ap.add_argument("--d-model", type=int, default=2048)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--kv-heads", type=int, default=4)
ap.add_argument("--ffn", type=int, default=5632)
ap.add_argument("--vocab", type=int, default=32000)
ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
ap.add_argument("--shards", type=int, default=1)
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
C, hd = a.d_model, a.d_model // a.heads
shapes = {"model.embed_tokens.weight": (a.vocab, C)}
for i in range(a.layers):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (C, C),
                   p + "self_attn.k_proj.weight": (a.kv_heads * hd, C),
                   p + "self_attn.v_proj.weight": (a.kv_heads * hd, C), p + "self_attn.o_proj.weight": (C, C),
                   p + "post_attention_layernorm.weight": (C,), p + "mlp.gate_proj.weight": (a.ffn, C),
                   p + "mlp.up_proj.weight": (a.ffn, C), p + "mlp.down_proj.weight": (C, a.ffn)})
shapes.update({"model.norm.weight": (C,), "lm_head.weight": (a.vocab, C)})
esize = 2 if a.dtype == "bf16" else 4
names = list(shapes)
per = -(-len(names) // a.shards)
groups = [names[k:k + per] for k in range(0, len(names), per)]
rng = np.random.default_rng(1)
weight_map, total = {}, 0
for k, group in enumerate(groups):
    fname = "model.safetensors" if a.shards == 1 else f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for n in group:
        size = int(np.prod(shapes[n])) * esize
        header[n] = {"dtype": "BF16" if esize == 2 else "F32", "shape": list(shapes[n]), "data_offsets": [at, at + size]}
        at += size
        weight_map[n] = fname
    total += at
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(os.path.join(a.out, fname), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for n in group:
            count = int(np.prod(shapes[n]))
            for start in range(0, count, 1 << 24):
                m = min(1 << 24, count - start)
                x = np.ones(m, np.float32) if len(shapes[n]) == 1 else rng.standard_normal(m, np.float32) * 0.02
                f.write((x.view(np.uint32) >> 16).astype(np.uint16).tobytes() if esize == 2 else x.tobytes())
if a.shards > 1:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(a.out, "model.safetensors.index.json"), "w"), indent=2)
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "num_hidden_layers": a.layers, "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "intermediate_size": a.ffn, "vocab_size": a.vocab, "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False,
           "torch_dtype": "bfloat16" if esize == 2 else "float32"},
          open(os.path.join(a.out, "config.json"), "w"), indent=2)
