#!/usr/bin/env python3
"""make_random_model.py - seeded random-weight Qwen3.5 checkpoints of the real shapes.

Writes a checkpoint in the published on-disk format (nested config.json with architectures
["Qwen3_5ForConditionalGeneration"], tensors under model.language_model.*, lm_head.weight only
when untied, BF16 everywhere except linear_attn.A_log and linear_attn.norm.weight in F32, a few
mtp.* and model.visual.* tensors that a text engine must skip, shards + model.safetensors.index.json).
Weights follow a real initialisation (matrices N(0, 0.02), zero-centred norms near 0, the gated
norm near 1, A_log = log U(1, 16), dt_bias near 1), so activations stay finite.

Needs only numpy (Debian: python3-numpy; run with /usr/bin/python3). Memory-frugal: tensors are
generated and written block by block, so the largest buffer is a few tens of MB whatever the size.

    /usr/bin/python3 tools/make_random_model.py --size 0.8b --out models/qwen35-0.8b-random

The module also holds the pieces the other tools share: the safetensors writer, the bf16
rounding, the published config.json builder and the tensor plan (name, dtype, shape).
"""
import argparse
import json
import os
import sys
import time
import zlib

import numpy as np

# ---------------------------------------------------------------------------------------------
# Shapes (qwen35-model.md section 1.3)

SIZES = {
    "0.8b": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=3584,
                 num_attention_heads=8, num_key_value_heads=2, linear_num_key_heads=16,
                 linear_num_value_heads=16, tie=True),
    "2b": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=6144,
               num_attention_heads=8, num_key_value_heads=2, linear_num_key_heads=16,
               linear_num_value_heads=16, tie=True),
    "4b": dict(hidden_size=2560, num_hidden_layers=32, intermediate_size=9216,
               num_attention_heads=16, num_key_value_heads=4, linear_num_key_heads=16,
               linear_num_value_heads=32, tie=True),
    "9b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=12288,
               num_attention_heads=16, num_key_value_heads=4, linear_num_key_heads=16,
               linear_num_value_heads=32, tie=False),
    # 27b: Qwen3.5-27B (GQA group 6, 3 DeltaNet value heads per key head); 27b-8l: its widths
    # over 8 layers (both layer types), small enough for an fp32 transformers reference
    "27b": dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=17408,
                num_attention_heads=24, num_key_value_heads=4, linear_num_key_heads=16,
                linear_num_value_heads=48, tie=False),
    "27b-8l": dict(hidden_size=5120, num_hidden_layers=8, intermediate_size=17408,
                   num_attention_heads=24, num_key_value_heads=4, linear_num_key_heads=16,
                   linear_num_value_heads=48, tie=False),
    # tiny: the fixture shape (tests/fixtures/tiny-untied-r2), for checking this tool itself
    "tiny": dict(hidden_size=64, num_hidden_layers=8, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, linear_num_key_heads=2,
                 linear_num_value_heads=4, tie=False, head_dim=64, linear_key_head_dim=32,
                 linear_value_head_dim=32, vocab_size=512, max_position_embeddings=4096,
                 mrope_section=[3, 3, 2], eos_token_id=None),
}


def text_config(hidden_size, num_hidden_layers, intermediate_size, num_attention_heads,
                num_key_value_heads, linear_num_key_heads, linear_num_value_heads, tie,
                head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
                vocab_size=248320, max_position_embeddings=262144, mrope_section=(11, 11, 10),
                rope_theta=10000000.0, partial_rotary_factor=0.25, full_attention_interval=4,
                eos_token_id=248044, pad_token_id=None, bos_token_id=None):
    """The text_config dict of a published Qwen3.5 config.json (keys as in the real files)."""
    layer_types = ["full_attention" if (i + 1) % full_attention_interval == 0
                   else "linear_attention" for i in range(num_hidden_layers)]
    rotary_dim = int(head_dim * partial_rotary_factor)
    assert sum(mrope_section) == rotary_dim // 2, "mrope_section must sum to rotary_dim / 2"
    return {
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_output_gate": True,
        "bos_token_id": bos_token_id,
        "dtype": "bfloat16",
        "eos_token_id": eos_token_id,
        "full_attention_interval": full_attention_interval,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": intermediate_size,
        "layer_types": layer_types,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": linear_key_head_dim,
        "linear_num_key_heads": linear_num_key_heads,
        "linear_num_value_heads": linear_num_value_heads,
        "linear_value_head_dim": linear_value_head_dim,
        "mamba_ssm_dtype": "float32",
        "max_position_embeddings": max_position_embeddings,
        "mlp_only_layers": [],
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": num_attention_heads,
        "num_hidden_layers": num_hidden_layers,
        "num_key_value_heads": num_key_value_heads,
        "pad_token_id": pad_token_id,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {
            "mrope_interleaved": True,
            "mrope_section": list(mrope_section),
            "partial_rotary_factor": partial_rotary_factor,
            "rope_theta": rope_theta,
            "rope_type": "default",
        },
        "tie_word_embeddings": bool(tie),
        "use_cache": True,
        "vocab_size": vocab_size,
    }


# A small vision tower description: the engine never reads it; transformers can build it cheaply.
def vision_stub(out_hidden_size):
    return {
        "model_type": "qwen3_5_vision",
        "depth": 1,
        "hidden_size": 32,
        "hidden_act": "gelu_pytorch_tanh",
        "intermediate_size": 64,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": out_hidden_size,
        "num_position_embeddings": 16,
        "initializer_range": 0.02,
    }


def published_config(tcfg, vision=None, image_token_id=248056, video_token_id=248057,
                     vision_start_token_id=248053, vision_end_token_id=248054):
    """The top-level config.json of the multimodal checkpoint wrapping text config `tcfg`."""
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "image_token_id": image_token_id,
        "model_type": "qwen3_5",
        "text_config": tcfg,
        "tie_word_embeddings": tcfg["tie_word_embeddings"],
        "transformers_version": "5.17.0",
        "video_token_id": video_token_id,
        "vision_config": vision if vision is not None else vision_stub(tcfg["hidden_size"]),
        "vision_end_token_id": vision_end_token_id,
        "vision_start_token_id": vision_start_token_id,
    }


# ---------------------------------------------------------------------------------------------
# Tensor plan

F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")
ZERO_CENTRED = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                "k_norm.weight")


def checkpoint_dtype(name):
    """Dtype of a language-model tensor in the published checkpoint."""
    return "F32" if name.endswith(F32_SUFFIXES) else "BF16"


def text_tensor_plan(t):
    """[(name, shape, init)] of the language model, in model order, with published names.
    init is one of: normal, zero_centred, ones_noise, a_log, dt_bias."""
    H, I = t["hidden_size"], t["intermediate_size"]
    nH, nKV, hd = t["num_attention_heads"], t["num_key_value_heads"], t["head_dim"]
    Hk, Hv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    dk, dv, K = t["linear_key_head_dim"], t["linear_value_head_dim"], t["linear_conv_kernel_dim"]
    key_dim, value_dim = Hk * dk, Hv * dv
    conv_dim = 2 * key_dim + value_dim
    p = "model.language_model."
    plan = [(p + "embed_tokens.weight", [t["vocab_size"], H], "normal")]
    for i, lt in enumerate(t["layer_types"]):
        L = f"{p}layers.{i}."
        plan.append((L + "input_layernorm.weight", [H], "zero_centred"))
        if lt == "full_attention":
            a = L + "self_attn."
            plan += [(a + "q_proj.weight", [2 * nH * hd, H], "normal"),
                     (a + "k_proj.weight", [nKV * hd, H], "normal"),
                     (a + "v_proj.weight", [nKV * hd, H], "normal"),
                     (a + "o_proj.weight", [H, nH * hd], "normal"),
                     (a + "q_norm.weight", [hd], "zero_centred"),
                     (a + "k_norm.weight", [hd], "zero_centred")]
        else:
            a = L + "linear_attn."
            plan += [(a + "in_proj_qkv.weight", [conv_dim, H], "normal"),
                     (a + "in_proj_z.weight", [value_dim, H], "normal"),
                     (a + "in_proj_b.weight", [Hv, H], "normal"),
                     (a + "in_proj_a.weight", [Hv, H], "normal"),
                     (a + "conv1d.weight", [conv_dim, 1, K], "normal"),
                     (a + "dt_bias", [Hv], "dt_bias"),
                     (a + "A_log", [Hv], "a_log"),
                     (a + "norm.weight", [dv], "ones_noise"),
                     (a + "out_proj.weight", [H, value_dim], "normal")]
        plan += [(L + "post_attention_layernorm.weight", [H], "zero_centred"),
                 (L + "mlp.gate_proj.weight", [I, H], "normal"),
                 (L + "mlp.up_proj.weight", [I, H], "normal"),
                 (L + "mlp.down_proj.weight", [H, I], "normal")]
    plan.append((p + "norm.weight", [H], "zero_centred"))
    if not t["tie_word_embeddings"]:
        plan.append(("lm_head.weight", [t["vocab_size"], H], "normal"))
    return plan


def skipped_tensor_plan(t):
    """A few mtp.* and model.visual.* tensors (shapes as in the real files) a text engine skips."""
    H = t["hidden_size"]
    return [("mtp.fc.weight", [H, 2 * H], "normal"),
            ("mtp.pre_fc_norm_embedding.weight", [H], "zero_centred"),
            ("mtp.pre_fc_norm_hidden.weight", [H], "zero_centred"),
            ("mtp.norm.weight", [H], "zero_centred"),
            ("mtp.layers.0.input_layernorm.weight", [H], "zero_centred"),
            ("model.visual.patch_embed.proj.weight", [32, 3, 2, 4, 4], "normal"),
            ("model.visual.merger.linear_fc2.weight", [H, 128], "normal")]


# ---------------------------------------------------------------------------------------------
# bf16 and the safetensors writer

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "I64": 8, "U8": 1}


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bf16 bit patterns, round to nearest even (as torch .to(bfloat16))."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = ((u >> 16) & 1) + np.uint32(0x7FFF)
    out = ((u + r) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def nbytes(dtype, shape):
    n = DTYPE_BYTES[dtype]
    for s in shape:
        n *= s
    return n


def write_safetensors(path, entries, metadata=None):
    """entries: list of (name, dtype, shape, producer); producer() yields bytes-like chunks whose
    total length must be exactly the tensor's size. Streams to `path`; returns bytes of data."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    off = 0
    for name, dtype, shape, _ in entries:
        n = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * ((8 - len(hb) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for name, dtype, shape, producer in entries:
            want, got = nbytes(dtype, shape), 0
            for chunk in producer():
                mv = memoryview(chunk).cast("B")
                f.write(mv)
                got += len(mv)
            if got != want:
                raise RuntimeError(f"{path}: tensor {name}: produced {got} bytes, expected {want}")
    os.replace(tmp, path)
    return off


def read_safetensors_header(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def write_checkpoint(out_dir, entries, n_shards=None, shard_bytes=None, metadata=None):
    """Writes entries (see write_safetensors) as model.safetensors (one shard) or as
    model-0000i-of-0000n.safetensors + model.safetensors.index.json. Shards are cut in entry
    order, either into n_shards of about equal size or at shard_bytes. Returns the file names."""
    os.makedirs(out_dir, exist_ok=True)
    sizes = [nbytes(d, s) for _, d, s, _ in entries]
    total = sum(sizes)
    groups, cur, cur_bytes = [], [], 0
    limit = (total + n_shards - 1) // n_shards if n_shards else shard_bytes
    for e, sz in zip(entries, sizes):
        if cur and cur_bytes + sz > limit and (not n_shards or len(groups) < n_shards - 1):
            groups.append(cur)
            cur, cur_bytes = [], 0
        cur.append(e)
        cur_bytes += sz
    groups.append(cur)
    meta = {"format": "pt"}
    meta.update(metadata or {})
    if len(groups) == 1:
        write_safetensors(os.path.join(out_dir, "model.safetensors"), groups[0], meta)
        return ["model.safetensors"]
    names, weight_map = [], {}
    for i, g in enumerate(groups):
        fn = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(os.path.join(out_dir, fn), g, meta)
        names.append(fn)
        for name, _, _, _ in g:
            weight_map[name] = fn
    index = {"metadata": {"total_size": total},
             "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return names


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------------------
# Random initialisation

BLOCK_ELEMS = 1 << 23  # 8M elements per generated block (32 MB of float32)


_TILES = {}


def _tile(init, dtype, seed):
    """2 blocks of seeded values of one init, converted once (the tiled mode's source)."""
    key = (init, dtype, seed)
    if key not in _TILES:
        prod = random_producer("tile:" + init, (2 * BLOCK_ELEMS,), init, dtype, seed)
        _TILES[key] = np.concatenate(list(prod()))
    return _TILES[key]


def random_producer(name, shape, init, dtype, seed, tiled=False):
    """A producer of the tensor's bytes; each tensor has its own seeded stream (seed, crc(name)),
    so its values do not depend on the order or the sharding. tiled: the tensor is cut from one
    seeded block per init at an offset of its own (repeating every BLOCK_ELEMS values): the same
    value distribution at disk speed, for speed runs of the large sizes only."""
    def produce_tiled():
        src = _tile(init, dtype, seed)
        n = int(np.prod(shape))
        off = zlib.crc32(name.encode()) % BLOCK_ELEMS
        while n > 0:
            m = min(n, BLOCK_ELEMS)
            yield src[off:off + m]
            n -= m

    def produce():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        rows = shape[0]
        row_elems = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        step = max(1, BLOCK_ELEMS // row_elems)
        for r0 in range(0, rows, step):
            n = min(step, rows - r0) * row_elems
            if init == "normal":
                x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
            elif init == "zero_centred":
                x = rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
            elif init == "ones_noise":
                x = 1 + rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)
            elif init == "dt_bias":
                x = 1 + rng.standard_normal(n, dtype=np.float32) * np.float32(0.1)
            elif init == "a_log":
                x = np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
            else:
                raise ValueError(f"unknown init {init} for {name}")
            x = x.astype(np.float32, copy=False)
            yield f32_to_bf16_bits(x) if dtype == "BF16" else x
    return produce_tiled if tiled else produce


def make_random_checkpoint(out_dir, size, seed=0, shard_gb=1.0, n_shards=None, log=print,
                           tiled=False):
    spec = dict(SIZES[size])
    tcfg = text_config(**spec)
    plan = text_tensor_plan(tcfg) + skipped_tensor_plan(tcfg)
    entries = []
    for name, shape, init in plan:
        dt = checkpoint_dtype(name)
        entries.append((name, dt, shape, random_producer(name, shape, init, dt, seed, tiled)))
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "config.json"), published_config(tcfg))
    gen = {"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
           "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
           "transformers_version": "5.17.0"}
    if size == "tiny":
        gen = {"transformers_version": "5.17.0"}
    write_json(os.path.join(out_dir, "generation_config.json"), gen)
    files = write_checkpoint(out_dir, entries, n_shards=n_shards,
                             shard_bytes=int(shard_gb * (1 << 30)),
                             metadata={"strata_random_seed": seed, "strata_size": size})
    n_params = sum(int(np.prod(s)) for n, s, _ in plan if not n.startswith(("mtp.", "model.visual.")))
    log(f"{out_dir}: size {size}, seed {seed}, {len(files)} file(s), "
        f"{n_params / 1e9:.3f} G text parameters")
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", required=True, choices=sorted(SIZES))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-gb", type=float, default=1.0, help="cut shards at this size")
    ap.add_argument("--shards", type=int, default=None, help="exactly this many shards instead")
    ap.add_argument("--tiled", action="store_true",
                    help="cut every tensor from one seeded block per init (speed runs of 27b)")
    a = ap.parse_args()
    t0 = time.time()
    make_random_checkpoint(a.out, a.size, a.seed, a.shard_gb, a.shards, tiled=a.tiled)
    print(f"done in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
