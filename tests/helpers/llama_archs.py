"""llama.cpp's random-model generator, ported: what ``tests/test-llama-archs.cpp
-o DIR`` writes, written through the same llama.cpp calls.

``save_models`` there builds a ``gguf_context`` holding every key of
``get_gguf_ctx`` (the fixture: clamp_kqv 1, causal, sliding window 32,
patterns, SSM / KDA / XIELU / posnet sizes, ... whether or not the arch reads
them), creates the model from it with ``llama_model_init_from_user`` (random
normal weights, ``set_tensor_data``) and saves it with
``llama_model_save_to_file`` -- whose saver (src/llama-model-saver.cpp) writes
every hyper-parameter llama.cpp holds for the model, read or defaulted. This
module does the same through llama-cpp-python's bindings of those functions
and ggml's own ``gguf_*`` API, for the architectures the harness has.

    python -m tests.helpers.llama_archs ARCH OUT.gguf [--moe] [--seed N]

(run in a subprocess: a llama.cpp abort ends it, not the caller). Keys follow
``get_gguf_ctx`` of the vendored test-llama-archs.cpp, line for line, for the
branches these archs take.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

# gguf_type (ggml/include/gguf.h)
U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10

# test-llama-archs.cpp get_gguf_ctx (lines 148-150, 231-233): the MLA sizes
MLA_ARCHS = ("deepseek2", "deepseek32", "glm-dsa", "kimi-linear", "mistral4")  # and LLM_ARCH_MISTRAL4 (156, 240)
# test-llama-archs.cpp get_gguf_ctx: n_head per layer with a 0 (recurrent / short-conv) layer 1
HYBRID_HEADS = ("granitehybrid", "kimi-linear", "lfm2", "lfm2moe")


def fixture(arch: str, moe: bool) -> list[tuple[str, int, object]]:
    """``get_gguf_ctx(arch, moe)``: ``(key, gguf type, value)`` in its order."""
    n_ctx, n_vocab, n_embd, n_head, n_ff, n_layer = 256, 128, 256, 2, 384, 2
    if arch == "llama4":
        n_layer = 4
    elif arch == "hrm_text":
        n_layer = 6  # 1 layer per stack x 2 h-cycles x (2 l-cycles + 1) cache slots
    elif arch in ("qwen3", "afmoe"):
        n_head = 4
    elif arch in MLA_ARCHS:
        n_embd, n_head, n_ff = 128, 1, 192
    n_head_kv = 1 if arch == "qwen3" else 2 if arch == "afmoe" else n_head
    n_embd_head = n_embd // n_head
    kv = [("general.architecture", STR, arch), ("%s.vocab_size", U32, n_vocab), ("%s.context_length", U32, n_ctx),
          ("%s.embedding_length", U32, n_embd), ("%s.features_length", U32, n_embd),
          ("%s.block_count", U32, n_layer), ("%s.leading_dense_block_count", U32, 1),
          ("%s.feed_forward_length", U32, n_ff), ("%s.use_parallel_residual", BOOL, False),
          ("%s.logit_scale", F32, 1.0), ("%s.time_mix_extra_dim", U32, 64), ("%s.time_decay_extra_dim", U32, 128),
          ("%s.full_attention_interval", U32, 2)]
    if arch in HYBRID_HEADS:
        per_layer = [0 if il == 1 else n_head for il in range(n_layer)]
        kv += [("%s.attention.head_count", (ARR, U32), per_layer), ("%s.attention.head_count_kv", (ARR, U32), per_layer)]
    else:
        kv += [("%s.attention.head_count", U32, n_head), ("%s.attention.head_count_kv", U32, n_head_kv)]
    kv += [("%s.attention.max_alibi_bias", F32, 8.0)]
    if arch in MLA_ARCHS:
        kv += [("%s.attention.key_length", U32, 576), ("%s.attention.value_length", U32, 512),
               ("%s.rope.dimension_count", U32, 64), ("%s.attention.key_length_mla", U32, 192),
               ("%s.attention.value_length_mla", U32, 128)]
    kv += [("%s.attention.clamp_kqv", F32, 1.0), ("%s.attention.layer_norm_epsilon", F32, 1e-5),
           ("%s.attention.layer_norm_rms_epsilon", F32, 1e-5), ("%s.attention.group_norm_epsilon", F32, 1e-5),
           ("%s.attention.group_norm_groups", U32, 8), ("%s.attention.q_lora_rank", U32, 512),
           ("%s.attention.kv_lora_rank", U32, 512), ("%s.attention.relative_buckets_count", U32, 8),
           ("%s.attention.sliding_window", U32, n_ctx // 8)]
    if arch in ("cohere2moe", "mimo2"):
        kv += [("%s.attention.sliding_window_pattern", (ARR, U32), [il % 2 for il in range(n_layer)])]
    else:
        kv += [("%s.attention.sliding_window_pattern", U32, 2)]
    kv += [("%s.attention.indexer.head_count", U32, 64), ("%s.attention.indexer.key_length", U32, 128),
           ("%s.attention.indexer.top_k", U32, 131072), ("%s.attention.indexer.block_size", U32, 4),
           ("%s.attention.indexer.kpool", U32, 4), ("%s.attention.indexer.kpool_select_tail", BOOL, True),
           ("%s.attention.indexer.local_blocks", U32, 1),
           ("%s.rope.dimension_sections", (ARR, U32), [n_embd_head // 4] * 4)]
    kv += [("tokenizer.ggml.model", STR, "test"), ("tokenizer.ggml.tokens", (ARR, STR), [f"tok_{i}" for i in range(n_vocab)]),
           ("tokenizer.ggml.scores", (ARR, F32), [0.0] * n_vocab)]
    if moe:
        kv += [("%s.expert_feed_forward_length", U32, n_ff), ("%s.expert_shared_feed_forward_length", U32, n_ff // 2),
               ("%s.expert_latent_length", U32, n_ff), ("%s.interleave_moe_layer_step", U32, 2),
               ("%s.expert_count", U32, 2), ("%s.expert_used_count", U32, 2), ("%s.expert_shared_count", U32, 1),
               ("%s.expert_gating_func", U32, 2), ("%s.expert_group_scale", F32, 1.0),
               ("%s.experts_per_group", U32, 1)]
    # test-llama-archs.cpp:434 LLM_KV_SSM_INNER_SIZE: 256 for QWEN3NEXT / QWEN35 / QWEN35MOE (/ QWEN4EXP),
    # whose loaders size the delta net's value heads by ssm.state_size (qwen35moe.cpp load_block_trunk
    # head_v_dim = ssm_d_state) and whose graphs by inner_size / time_step_rank: 256 / 2 = 128 agrees
    ssm_inner = 256 if arch in ("qwen3next", "qwen35", "qwen35moe") else 2 * n_embd
    kv += [("%s.posnet.embedding_length", U32, n_embd), ("%s.posnet.block_count", U32, n_layer),
           ("%s.convnext.embedding_length", U32, n_embd), ("%s.convnext.block_count", U32, n_layer),
           ("%s.xielu.alpha_n", F32, 1.0), ("%s.xielu.alpha_p", F32, 1.0), ("%s.xielu.beta", F32, 1.0),
           ("%s.xielu.eps", F32, 1e-7), ("%s.ssm.inner_size", U32, ssm_inner), ("%s.ssm.conv_kernel", U32, 4),
           ("%s.ssm.state_size", U32, 128), ("%s.ssm.time_step_rank", U32, n_head),
           ("%s.ssm.group_count", U32, 2), ("%s.kda.head_dim", U32, 128), ("%s.kda.safe_gate", BOOL, True),
           ("%s.kda.gate_lower_bound", F32, -5.0), ("%s.wkv.head_size", U32, n_embd // n_head),
           ("%s.shortconv.l_cache", U32, 3), ("%s.residual_scale", F32, 3.5565588200778455),
           ("%s.attn_res.block_size", U32, 12), ("%s.activation.situ.beta", F32, 4.0),
           ("%s.activation.situ.linear_beta", F32, 25.0)]
    if arch == "hrm_text":
        # 6 cache slots alias 2 physical blocks: 1 low-stack layer + 1 high-stack layer
        kv += [("%s.hrm.layers_per_stack", U32, 1), ("%s.hrm.h_cycles", U32, 2), ("%s.hrm.l_cycles", U32, 2)]
    return kv


def _lib(name: str):
    import llama_cpp

    return ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / name))


def write_random_model(arch: str, out: str, moe: bool, seed: int = 0, stdev: float = 0.1) -> None:
    import llama_cpp as lc

    g = _lib("libggml-base.so")
    g.gguf_init_empty.restype = ctypes.c_void_p
    g.gguf_get_n_kv.argtypes = [ctypes.c_void_p]
    for fn, ct in (("gguf_set_val_u32", ctypes.c_uint32), ("gguf_set_val_i32", ctypes.c_int32),
                   ("gguf_set_val_f32", ctypes.c_float), ("gguf_set_val_bool", ctypes.c_bool),
                   ("gguf_set_val_str", ctypes.c_char_p)):
        getattr(g, fn).argtypes = [ctypes.c_void_p, ctypes.c_char_p, ct]
    g.gguf_set_arr_data.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    g.gguf_set_arr_str.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    ggml = _lib("libggml-base.so")
    ggml.ggml_nelements.argtypes = [ctypes.c_void_p]
    ggml.ggml_nelements.restype = ctypes.c_int64
    ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
    ggml.ggml_get_name.restype = ctypes.c_char_p
    ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
    ggml.ggml_nbytes.restype = ctypes.c_size_t
    ggml.ggml_backend_tensor_set.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

    ctx = g.gguf_init_empty()
    keep = []
    for key, ty, val in fixture(arch, moe):
        k = (key % arch if "%s" in key else key).encode()
        if ty == U32:
            g.gguf_set_val_u32(ctx, k, int(val))
        elif ty == F32:
            g.gguf_set_val_f32(ctx, k, float(val))
        elif ty == BOOL:
            g.gguf_set_val_bool(ctx, k, bool(val))
        elif ty == STR:
            g.gguf_set_val_str(ctx, k, val.encode())
        elif ty == (ARR, STR):
            arr = (ctypes.c_char_p * len(val))(*[s.encode() for s in val])
            keep.append(arr)
            g.gguf_set_arr_str(ctx, k, arr, len(val))
        else:
            elem = ty[1]
            np_t = {U32: np.uint32, F32: np.float32}[elem]
            a = np.ascontiguousarray(val, dtype=np_t)
            keep.append(a)
            g.gguf_set_arr_data(ctx, k, elem, a.ctypes.data, len(val))

    rng = {"seed": seed}

    @lc.llama_model_set_tensor_data_t
    def set_tensor_data(tensor, user):
        # set_tensor_data: normal(0, stdev) per tensor (seeded by the name; Mamba's
        # ssm_a negative); F32 or F16 (the types llama_model_init_from_user makes)
        name = ggml.ggml_get_name(tensor).decode()
        n = ggml.ggml_nelements(tensor)
        nbytes = ggml.ggml_nbytes(tensor)
        r = np.random.default_rng([rng["seed"], sum(map(ord, name)), len(name)])
        v = r.normal(0.0, stdev, n).astype(np.float32)
        if "ssm_a" in name:
            v = -np.abs(v)
        data = v if nbytes == 4 * n else v.astype(np.float16)
        data = np.ascontiguousarray(data)
        ggml.ggml_backend_tensor_set(tensor, data.ctypes.data, 0, data.nbytes)

    lc.llama_backend_init()
    params = lc.llama_model_default_params()
    params.n_gpu_layers = 0
    model = lc.llama_model_init_from_user(ctx, set_tensor_data, None, params)
    if not model:
        raise RuntimeError(f"llama_model_init_from_user refused the {arch} fixture")
    lc.llama_model_save_to_file(model, out.encode())
    lc.llama_model_free(model)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("arch")
    ap.add_argument("out")
    ap.add_argument("--moe", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    write_random_model(a.arch, a.out, a.moe, a.seed)
    return 0 if Path(a.out).is_file() else 1


if __name__ == "__main__":
    sys.exit(main())
