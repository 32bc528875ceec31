#!/usr/bin/env python3
"""make_bad_corpus.py - writes tests/bad/, the checkpoint-loading corpus (python3 stdlib only).

Starts from a tiny valid Qwen3.5 checkpoint (hidden 16, 4 layers with layer 3 full attention,
vocab 32, nH 2, nKV 1, head_dim 8, partial_rotary_factor 0.25, Hk 2, Hv 4, dk = dv = 4, K 4,
intermediate 32; BF16 except linear_attn.A_log and linear_attn.norm.weight in F32; tied; names
under model.language_model.) and derives every malformed case from it. Deterministic: the same
bytes on every run (no randomness, no timestamps), so the output is committed.

tests/bad/<case>/ holds a checkpoint directory and expected.txt. The prefix of <case> says which
stage must reject it (tests/test_loader.c checks that the earlier stages accept it):
  st_*     safetensors_open_dir      cfg_*  config_load      model_*  model_load
  ok_*     must load; expected.txt holds "loads" and "skipped N" (vision/mtp tensors ignored)
For the failing cases every line of expected.txt must appear in the error message.

Tensor element j of tensor `name` holds ((7 j + len(name)) % 17 - 8) / 16, exact in bf16 and f32,
so the test can check the bytes it reads.

Usage: python3 tools/make_bad_corpus.py [OUT_DIR]   (default: tests/bad next to this script)
"""
import json
import os
import shutil
import struct
import sys

H, V, I, L = 16, 32, 32, 4
NH, NKV, HD = 2, 1, 8
HK, HV, DK, DV, K = 2, 4, 4, 4, 4
KEY_DIM, VALUE_DIM = HK * DK, HV * DV
CONV_DIM = 2 * KEY_DIM + VALUE_DIM
LAYER_TYPES = ["linear_attention"] * 3 + ["full_attention"]
LM = "model.language_model."

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4,
              "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


def value(name, j):
    return ((7 * j + len(name)) % 17 - 8) / 16.0


def tensor_bytes(name, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    vals = [value(name, j) for j in range(n)]
    if dtype == "F32":
        return struct.pack("<%df" % n, *vals)
    if dtype == "BF16":
        return b"".join(struct.pack("<f", v)[2:] for v in vals)  # exact: top 16 bits
    if dtype == "F16":
        return struct.pack("<%de" % n, *vals)
    if dtype == "U8":
        return bytes((j * 5) & 255 for j in range(n))
    raise ValueError(dtype)


def T(name, shape, dtype="BF16"):
    return {"name": name, "dtype": dtype, "shape": list(shape)}


def text_tensors(prefix=LM, layer_types=LAYER_TYPES, tied=True):
    ts = [T(prefix + "embed_tokens.weight", (V, H)), T(prefix + "norm.weight", (H,))]
    if not tied:
        ts.append(T("lm_head.weight", (V, H)))
    for i, lt in enumerate(layer_types):
        p = "%slayers.%d." % (prefix, i)
        ts += [T(p + "input_layernorm.weight", (H,)), T(p + "post_attention_layernorm.weight", (H,)),
               T(p + "mlp.gate_proj.weight", (I, H)), T(p + "mlp.up_proj.weight", (I, H)),
               T(p + "mlp.down_proj.weight", (H, I))]
        if lt == "full_attention":
            a = p + "self_attn."
            ts += [T(a + "q_proj.weight", (2 * NH * HD, H)), T(a + "k_proj.weight", (NKV * HD, H)),
                   T(a + "v_proj.weight", (NKV * HD, H)), T(a + "o_proj.weight", (H, NH * HD)),
                   T(a + "q_norm.weight", (HD,)), T(a + "k_norm.weight", (HD,))]
        else:
            a = p + "linear_attn."
            ts += [T(a + "in_proj_qkv.weight", (CONV_DIM, H)), T(a + "in_proj_z.weight", (VALUE_DIM, H)),
                   T(a + "in_proj_b.weight", (HV, H)), T(a + "in_proj_a.weight", (HV, H)),
                   T(a + "conv1d.weight", (CONV_DIM, 1, K)), T(a + "dt_bias", (HV,)),
                   T(a + "A_log", (HV,), "F32"), T(a + "norm.weight", (DV,), "F32"),
                   T(a + "out_proj.weight", (H, VALUE_DIM))]
    return ts


# tensors a text-only engine must skip (and count)
SKIPPED = [T("model.visual.patch_embed.proj.weight", (8, 12)), T("model.visual.merger.norm.weight", (8,)),
           T("mtp.fc.weight", (H, 2 * H)), T("mtp.norm.weight", (H,))]

# a few tensors for the safetensors-level cases (the config there is valid; the file is not)
SMALL = [T(LM + "embed_tokens.weight", (V, H)), T(LM + "norm.weight", (H,)),
         T(LM + "layers.0.linear_attn.A_log", (HV,), "F32")]


def text_config(**over):
    tc = {
        "model_type": "qwen3_5_text", "vocab_size": V, "hidden_size": H, "intermediate_size": I,
        "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV,
        "head_dim": HD, "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "max_position_embeddings": 64, "attention_bias": False, "attn_output_gate": True,
        "linear_conv_kernel_dim": K, "linear_key_head_dim": DK, "linear_value_head_dim": DV,
        "linear_num_key_heads": HK, "linear_num_value_heads": HV,
        "full_attention_interval": 4, "layer_types": list(LAYER_TYPES),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                            "partial_rotary_factor": 0.25, "mrope_section": [1, 0, 0],
                            "mrope_interleaved": True},
        "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
        "eos_token_id": 31, "dtype": "bfloat16",
    }
    for k, v in over.items():
        if v is DROP:
            tc.pop(k, None)
        else:
            tc[k] = v
    return tc


DROP = object()


def nested_config(tie=True, **over):
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "image_token_id": 28, "video_token_id": 29, "vision_start_token_id": 26,
            "vision_end_token_id": 27, "tie_word_embeddings": tie,
            "text_config": text_config(**over),
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 8}}


def flat_config(tie=True, **over):
    c = {"architectures": ["Qwen3_5ForCausalLM"]}
    c.update(text_config(**over))
    c["tie_word_embeddings"] = tie
    return c


def dumps_config(c):
    return (json.dumps(c, indent=2) + "\n").encode()


def safetensors(tensors, metadata={"format": "pt"}, edit=None, header_text=None, pad=True):
    """Serialises like the reference writer (tensors sorted by decreasing alignment then name,
    header padded with spaces to a multiple of 8). edit(header_dict) may change the header
    before it is written; header_text replaces it entirely. Tensors may carry "data" (bytes)."""
    order = sorted(tensors, key=lambda t: (-DTYPE_SIZE.get(t["dtype"], 1), t["name"]))
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for t in order:
        data = t.get("data")
        if data is None:
            data = tensor_bytes(t["name"], t["dtype"], t["shape"])
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"],
                             "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    if edit:
        edit(header)
    text = header_text if header_text is not None else json.dumps(header, separators=(",", ":"))
    hb = text.encode()
    if pad:
        hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + b"".join(blobs)


def index_json(shard_of, total=0):
    return (json.dumps({"metadata": {"total_size": total},
                        "weight_map": dict(sorted(shard_of.items()))}, indent=2) + "\n").encode()


SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def sharded(tensors, split=None):
    """Two shards: the first `split` tensors (default half) in shard 1, the rest in shard 2."""
    if split is None:
        split = len(tensors) // 2
    a, b = tensors[:split], tensors[split:]
    shard_of = {t["name"]: SHARD1 for t in a}
    shard_of.update({t["name"]: SHARD2 for t in b})
    total = sum(len(tensor_bytes(t["name"], t["dtype"], t["shape"])) for t in tensors)
    return {SHARD1: safetensors(a), SHARD2: safetensors(b),
            "model.safetensors.index.json": index_json(shard_of, total)}


def header_of(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n])


def replace(tensors, name, **over):
    out = []
    for t in tensors:
        if t["name"] == name:
            t = dict(t)
            t.update(over)
        out.append(t)
    return out


CASES = {}


def case(name, files, expected):
    assert name not in CASES, name
    CASES[name] = (files, expected)


def full(prefix=LM, tied=True, extra=True):
    return text_tensors(prefix, tied=tied) + (SKIPPED if extra else [])


def build():
    nested = dumps_config(nested_config())
    flat = dumps_config(flat_config())

    # ---- valid checkpoints ------------------------------------------------------------------
    case("ok_nested_single", {"config.json": nested, "model.safetensors": safetensors(full())},
         ["loads", "skipped 4"])
    case("ok_nested_sharded", dict({"config.json": nested}, **sharded(full())),
         ["loads", "skipped 4"])
    # Qwen3_5ForCausalLM writes its text tensors under "model." and has no vision tower
    case("ok_flat_sharded", dict({"config.json": flat},
                                 **sharded(text_tensors("model.") + SKIPPED[2:])),
         ["loads", "skipped 2"])
    untied = dumps_config(nested_config(tie=False))
    case("ok_nested_untied", {"config.json": untied,
                              "model.safetensors": safetensors(full(tied=False))},
         ["loads", "skipped 4"])

    # ---- safetensors level ------------------------------------------------------------------
    small = safetensors(SMALL)
    F = "model.safetensors: "

    def st(name, blob, expected):
        case(name, {"config.json": nested, "model.safetensors": blob}, expected)

    st("st_file_too_short", small[:5],
       [F + "file is 5 bytes, too short for the 8-byte header length"])
    hlen = struct.unpack("<Q", small[:8])[0]
    # cut inside the last tensor's data: the header is intact, the data is short
    st("st_truncated", small[:-10],
       [F + "tensor " + LM + "norm.weight: data_offsets [1040, 1072] run past the end of the "
        "data (1062 bytes after the header"])
    st("st_header_len_past_end", struct.pack("<Q", 1000000) + small[8:],
       [F + "header length 1000000 runs past the end of the file (%d bytes" % len(small)])
    st("st_header_len_too_small", struct.pack("<Q", 1) + small[8:],
       [F + "header length 1 is too small (expected at least 2"])
    st("st_header_not_object", safetensors([], metadata=None, header_text="[1, 2]"),
       [F + "header must start with '{', found byte 0x5b"])
    st("st_header_json_malformed",
       safetensors([], metadata=None, header_text='{"' + LM + 'norm.weight": {"dtype": "BF16",'),
       [F + "header is not valid JSON"])
    dup = ('{"%snorm.weight":{"dtype":"BF16","shape":[16],"data_offsets":[0,32]},'
           '"%snorm.weight":{"dtype":"BF16","shape":[16],"data_offsets":[32,64]}}' % (LM, LM))
    st("st_header_duplicate_key",
       safetensors([], metadata=None, header_text=dup) + bytes(64),
       [F + "header is not valid JSON", "duplicate object key"])

    def edit_entry(name, **over):
        def f(h):
            h[name].update(over)
        return f

    def off(name, b, e):
        return edit_entry(name, data_offsets=[b, e])

    st("st_offsets_out_of_range", safetensors(SMALL, edit=off(LM + "norm.weight", 1040, 5000)),
       [F + "tensor " + LM + "norm.weight: data_offsets [1040, 5000] run past the end of the "
        "data (1072 bytes after the header"])
    st("st_offsets_reversed", safetensors(SMALL, edit=off(LM + "norm.weight", 1072, 1040)),
       [F + "tensor " + LM + "norm.weight: data_offsets [1072, 1040]: begin is after end"])
    st("st_offsets_negative", safetensors(SMALL, edit=off(LM + "norm.weight", -32, 0)),
       [F + "tensor " + LM + "norm.weight: data_offsets: expected [begin, end] (two integers >= 0)"])
    # norm.weight moved onto the last 32 bytes of embed_tokens: same length, overlapping
    st("st_offsets_overlap", safetensors(SMALL, edit=off(LM + "norm.weight", 1008, 1040)),
       [F + "tensor " + LM + "norm.weight: data_offsets [1008, 1040] overlap tensor " + LM +
        "embed_tokens.weight [16, 1040]"])

    def hole(h):  # every offset after A_log shifted by 16 bytes of padding
        for k, v in h.items():
            if k != "__metadata__" and v["data_offsets"][0] >= 16:
                v["data_offsets"] = [v["data_offsets"][0] + 16, v["data_offsets"][1] + 16]
    blob = safetensors(SMALL, edit=hole)
    hn = struct.unpack("<Q", blob[:8])[0]
    blob = blob[:8 + hn + 16] + bytes(16) + blob[8 + hn + 16:]
    st("st_offsets_hole", blob,
       [F + "tensor " + LM + "embed_tokens.weight: data_offsets [32, 1056] leave a hole: bytes "
        "[16, 32) belong to no tensor"])
    st("st_trailing_bytes", small + bytes(8),
       [F + "8 bytes of data after the last tensor (tensors end at 1072, the data is 1080 bytes"])
    st("st_unknown_dtype", safetensors(SMALL, edit=edit_entry(LM + "norm.weight", dtype="Q4_K")),
       [F + "tensor " + LM + 'norm.weight: unknown dtype "Q4_K"'])
    st("st_shape_mismatch", safetensors(SMALL, edit=edit_entry(LM + "norm.weight", shape=[16, 16])),
       [F + "tensor " + LM + "norm.weight: shape [16, 16] BF16 needs 512 bytes, but data_offsets "
        "[1040, 1072] hold 32"])
    st("st_shape_negative", safetensors(SMALL, edit=edit_entry(LM + "norm.weight", shape=[-16])),
       [F + "tensor " + LM + "norm.weight: shape[0]: expected an integer >= 0, found a negative"])
    st("st_shape_overflow",
       safetensors(SMALL, edit=edit_entry(LM + "norm.weight", shape=[1 << 62, 1 << 62, 4])),
       [F + "tensor " + LM + "norm.weight: shape [4611686018427387904, 4611686018427387904, 4] "
        "BF16 overflows a 64-bit byte count"])

    def drop_key(name, key):
        def f(h):
            del h[name][key]
        return f
    st("st_missing_dtype", safetensors(SMALL, edit=drop_key(LM + "norm.weight", "dtype")),
       [F + "tensor " + LM + 'norm.weight: missing "dtype"'])
    st("st_missing_offsets", safetensors(SMALL, edit=drop_key(LM + "norm.weight", "data_offsets")),
       [F + "tensor " + LM + 'norm.weight: missing "data_offsets"'])
    st("st_misaligned", safetensors([T("a.bytes", (2,), "U8"), T("b.f32", (4,), "F32")],
                                    edit=lambda h: (off("a.bytes", 0, 2)(h), off("b.f32", 2, 18)(h))),
       [F + "tensor b.f32: data at file offset", "is not aligned to its 4-byte dtype F32"])
    st("st_metadata_not_strings", safetensors(SMALL, metadata={"format": "pt", "step": 3}),
       [F + '__metadata__["step"]: expected a string, found an integer'])

    # ---- sharded ----------------------------------------------------------------------------
    IX = "model.safetensors.index.json: "
    case("st_no_weights", {"config.json": nested}, ["no model.safetensors or model.safetensors.index.json"])
    two = sharded(SMALL, split=1)  # embed_tokens in shard 1; A_log, norm in shard 2
    case("st_index_malformed", {"config.json": nested, SHARD1: two[SHARD1], SHARD2: two[SHARD2],
                                "model.safetensors.index.json": b'{"weight_map": {"a": }\n'},
         [IX + "malformed JSON at line 1"])
    case("st_index_no_weight_map", {"config.json": nested, SHARD1: two[SHARD1], SHARD2: two[SHARD2],
                                    "model.safetensors.index.json": b'{"metadata": {}}\n'},
         [IX + 'expected an object with a non-empty "weight_map"'])
    case("st_index_missing_shard", {"config.json": nested, SHARD1: two[SHARD1],
                                    "model.safetensors.index.json": two["model.safetensors.index.json"]},
         [IX + "tensor " + LM + "layers.0.linear_attn.A_log: shard \"" + SHARD2 + "\" is missing "
          "or unreadable", "No such file"])
    # the index puts norm.weight in shard 1, which does not have it (shard 2 doesn't either)
    shard_of = {LM + "embed_tokens.weight": SHARD1, LM + "layers.0.linear_attn.A_log": SHARD2,
                LM + "norm.weight": SHARD1}
    case("st_index_tensor_not_in_shard",
         {"config.json": nested, SHARD1: two[SHARD1],
          SHARD2: safetensors([SMALL[2]]), "model.safetensors.index.json": index_json(shard_of)},
         [IX + "tensor " + LM + "norm.weight: listed in the index under shard \"" + SHARD1 +
          "\", but", SHARD1 + " does not contain it"])
    case("st_index_wrong_shard",
         {"config.json": nested, SHARD1: two[SHARD1], SHARD2: two[SHARD2],
          "model.safetensors.index.json": index_json(shard_of)},
         [IX + "tensor " + LM + "norm.weight: the index says shard", SHARD1 + ", but it is in",
          SHARD2])
    shard_of = {LM + "embed_tokens.weight": SHARD1, LM + "layers.0.linear_attn.A_log": SHARD2}
    case("st_index_unlisted_tensor",
         {"config.json": nested, SHARD1: two[SHARD1], SHARD2: two[SHARD2],
          "model.safetensors.index.json": index_json(shard_of)},
         [SHARD2 + ": tensor " + LM + "norm.weight: in this shard but not listed in",
          "model.safetensors.index.json"])
    shard_of = {LM + "embed_tokens.weight": SHARD1, LM + "layers.0.linear_attn.A_log": SHARD2,
                LM + "norm.weight": SHARD2}
    case("st_index_duplicate_tensor",
         {"config.json": nested, SHARD1: safetensors(SMALL[:2]), SHARD2: two[SHARD2],
          "model.safetensors.index.json": index_json(shard_of)},
         ["tensor " + LM + "norm.weight appears twice: in", SHARD1 + " and in", SHARD2])
    shard_of = {LM + "embed_tokens.weight": SHARD1,
                LM + "norm.weight": "../ok_nested_single/model.safetensors"}
    case("st_index_escape",
         {"config.json": nested, SHARD1: two[SHARD1], "model.safetensors.index.json": index_json(shard_of)},
         [IX + "tensor " + LM + 'norm.weight: shard name "../ok_nested_single/model.safetensors" '
          "is not a file inside the checkpoint directory"])
    case("st_index_bad_shard",
         {"config.json": nested, SHARD1: two[SHARD1], SHARD2: two[SHARD2][:-40],
          "model.safetensors.index.json": two["model.safetensors.index.json"]},
         [SHARD2 + ": tensor " + LM, "run past the end of the data"])

    # ---- config level -----------------------------------------------------------------------
    C = "config.json: "

    def cfg(name, text, expected):
        case(name, {"config.json": text, "model.safetensors": small}, expected)

    case("cfg_missing", {"model.safetensors": small}, [C + "cannot open"])
    cfg("cfg_malformed", b'{"text_config": {"vocab_size": 32,,}}\n',
        [C + "malformed JSON at line 1, column"])
    cfg("cfg_not_object", b"[1, 2]\n", [C + "expected a JSON object at the top level, found an array"])
    cfg("cfg_missing_field", dumps_config(nested_config(hidden_size=DROP)),
        [C + "text_config.hidden_size: missing (a required field"])
    cfg("cfg_missing_field_flat", dumps_config(flat_config(linear_num_value_heads=DROP)),
        [C + "linear_num_value_heads: missing (a required field"])
    cfg("cfg_wrong_type", dumps_config(nested_config(hidden_size="16")),
        [C + 'text_config.hidden_size: expected an integer, found the string "16"'])
    cfg("cfg_bad_value", dumps_config(nested_config(num_key_value_heads=0)),
        [C + "text_config.num_key_value_heads: expected an integer >= 1, found 0"])
    cfg("cfg_heads_not_multiple", dumps_config(nested_config(num_key_value_heads=3)),
        [C + "text_config.num_attention_heads 2 is not a multiple of num_key_value_heads 3"])
    cfg("cfg_linear_heads_not_multiple", dumps_config(nested_config(linear_num_value_heads=3)),
        [C + "text_config.linear_num_value_heads 3 is not a multiple of linear_num_key_heads 2"])
    cfg("cfg_conv_kernel_range", dumps_config(nested_config(linear_conv_kernel_dim=9)),
        [C + "text_config.linear_conv_kernel_dim 9: at most 8 supported"])
    cfg("cfg_layer_types_length", dumps_config(nested_config(layer_types=LAYER_TYPES[:3])),
        [C + "text_config.layer_types: expected 4 entries (num_hidden_layers), found 3"])
    cfg("cfg_layer_types_unknown",
        dumps_config(nested_config(layer_types=["linear_attention", "sliding_attention"] + LAYER_TYPES[2:])),
        [C + 'text_config.layer_types[1]: expected "linear_attention" or "full_attention", found '
         'the string "sliding_attention"'])
    rope = text_config()["rope_parameters"]
    cfg("cfg_rotary_dim_odd",
        dumps_config(nested_config(rope_parameters=dict(rope, partial_rotary_factor=0.125))),
        [C + "text_config.partial_rotary_factor: head_dim 8 x 0.125 gives a rotary dimension of 1"])
    cfg("cfg_rope_type", dumps_config(nested_config(rope_parameters=dict(rope, rope_type="yarn"))),
        [C + 'text_config.rope_parameters.rope_type: only "default" RoPE is supported, found the '
         'string "yarn"'])
    cfg("cfg_too_many_layers", dumps_config(nested_config(num_hidden_layers=300, layer_types=DROP)),
        [C + "text_config.num_hidden_layers: 300 layers, at most 256 supported"])
    cfg("cfg_architecture", dumps_config(dict(nested_config(), architectures=["LlamaForCausalLM"])),
        [C + 'architectures[0]: expected "Qwen3_5ForConditionalGeneration" or "Qwen3_5ForCausalLM"',
         '"LlamaForCausalLM"'])
    cfg("cfg_text_config_type", dumps_config(dict(nested_config(), text_config=[])),
        [C + "text_config: expected an object, found an array"])
    cfg("cfg_eos_type", dumps_config(nested_config(eos_token_id="</s>")),
        [C + 'text_config.eos_token_id: expected an integer or a list of integers, found the string'])
    cfg("cfg_tie_type", dumps_config(dict(nested_config(), tie_word_embeddings="yes")),
        [C + 'tie_word_embeddings: expected true or false, found the string "yes"'])
    cfg("cfg_eps_range", dumps_config(nested_config(rms_norm_eps=-1e-6)),
        [C + "text_config.rms_norm_eps: expected a number in (0, 1], found -1e-06"])

    # ---- model level (structurally valid files; the model needs something else) ------------
    base = full()

    def model(name, cfg_text, tensors, expected):
        case(name, {"config.json": cfg_text, "model.safetensors": safetensors(tensors)}, expected)

    dt = LM + "layers.1.linear_attn.dt_bias"
    model("model_missing_tensor", nested, [t for t in base if t["name"] != dt],
          ["tensor " + dt + ": missing", "[4]"])
    q = LM + "layers.3.self_attn.q_proj.weight"
    model("model_wrong_shape", nested, replace(base, q, shape=[16, 16]),
          [F + "tensor " + q + ": expected shape [32, 16] (2 num_attention_heads head_dim, "
           "hidden_size) BF16, found [16, 16] BF16"])
    up = LM + "layers.0.mlp.up_proj.weight"
    model("model_wrong_dtype", nested, replace(base, up, dtype="F16"),
          [F + "tensor " + up + ": expected shape [32, 16] (intermediate_size, hidden_size) BF16, "
           "found [32, 16] F16"])
    emb = LM + "embed_tokens.weight"
    model("model_vocab_mismatch", nested, replace(base, emb, shape=[40, H]),
          [F + "tensor " + emb + ": expected shape [32, 16] (vocab_size, hidden_size) BF16, found "
           "[40, 16] BF16"])
    # config says 3 layers (all linear), the weights have 4: layer 3 is left over
    model("model_layers_mismatch", dumps_config(nested_config(num_hidden_layers=3, layer_types=DROP)),
          base, [F + "tensor " + LM + "layers.3.", "not part of a 3-layer Qwen3.5 text model"])
    model("model_layer_types_mismatch",
          dumps_config(nested_config(layer_types=["full_attention"] + LAYER_TYPES[1:])), base,
          ["tensor " + LM + "layers.0.self_attn.q_proj.weight: missing", "[32, 16]"])
    model("model_untied_no_lm_head", dumps_config(nested_config(tie=False)), base,
          ["tensor lm_head.weight: missing", "[32, 16]"])
    model("model_unknown_tensor", nested, base + [T(LM + "layers.0.mlp.gate_proj.bias", (I,))],
          [F + "tensor " + LM + "layers.0.mlp.gate_proj.bias: not part of"])
    tens = replace(base, q, shape=[16, 16])
    case("model_sharded_wrong_shape", dict({"config.json": nested}, **sharded(tens)),
         [SHARD2 + ": tensor " + q + ": expected shape [32, 16] (2 num_attention_heads head_dim, hidden_size) BF16, found [16, 16] BF16"])


README = """# tests/bad: checkpoint-loading corpus

Written by `tools/make_bad_corpus.py` (deterministic; do not edit by hand, re-run it).
Each directory is a checkpoint (config.json + .safetensors [+ index]) and expected.txt.
The prefix says which stage must reject it; tests/test_loader.c checks that the earlier
stages accept it and that every line of expected.txt appears in the error message:

| prefix   | rejected by            |
|----------|------------------------|
| `st_`    | safetensors_open_dir   |
| `cfg_`   | config_load            |
| `model_` | model_load             |
| `ok_`    | nothing: must load; expected.txt says how many vision/mtp tensors are skipped |

All cases also go through model_load, which must fail with the same message.
"""


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "bad")
    out = os.path.normpath(out)
    build()
    if os.path.isdir(out):
        for e in os.listdir(out):
            p = os.path.join(out, e)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(README)
    total = 0
    for name in sorted(CASES):
        files, expected = CASES[name]
        d = os.path.join(out, name)
        os.makedirs(d)
        for fn, data in sorted(files.items()):
            with open(os.path.join(d, fn), "wb") as f:
                f.write(data)
            total += len(data)
        with open(os.path.join(d, "expected.txt"), "w") as f:
            f.write("\n".join(expected) + "\n")
    print("%s: %d cases, %d bytes" % (out, len(CASES), total))


if __name__ == "__main__":
    main()
