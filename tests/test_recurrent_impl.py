"""impl's recurrent body (impl/recurrent.py) against HF's own modules, kind by kind.

Each kind builds its HF module from a tiny HF config with seeded random weights,
copies the weights into impl (split per role, as a family's ``to_impl`` would),
and runs the same rows through both on the same schedule (one call, one row per
call, mixed chunks): the branch (``attn_out``), the residual, and the state
after every call (HF's ``conv_states`` / ``recurrent_states`` / MiniMax's
``linear_cache``, in the canonical layout of ``impl.recurrent.RECURRENT_STATES``).

Precision: impl runs in float64 (NumPy); HF's module in float64 too, but HF
casts to float32 inside: its scans (``torch_*_gated_delta_rule``,
``*_kimi_delta_attention``: ``.to(torch.float32)``; ``mamba2_chunk_scan``:
``.float()``; MambaMixer: ``A = -exp(A_log.float())``), its RMS norms
(``hidden_states.to(torch.float32)``, the input norms and lightning's output
norm) and MiniMax's decay buffers (built in float32 at init). So the layer is
judged teacher-forced on HF's own normed rows (``teacher_forced``), the norm
apart, and every kind but short conv is held to a float32-sized bound
(``F32_NMSE``); short conv is float64 throughout in HF and held to
``F64_NMSE``. Every bound is a few orders above what the run measures (printed
with ``-s``) and orders below what a planted bug gives
(``test_planted_bug_is_caught``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from impl import Backend, ConfigError, NormSpec, RecurrentConfig
from impl.recurrent import RECURRENT_PROBES, RECURRENT_STATES
from impl.runner import load_layer, run_layer

F64_NMSE = 1e-24  # HF float64 throughout (short conv: measured 1e-31)
F32_NMSE = 1e-10  # HF's scan in float32 (measured up to 5e-12, a late state snapshot, at these sizes)
T = 70  # past HF's 64-row delta-rule chunk
SCHEDULES = {"prefill": None, "decode": [1] * T, "mixed": [3, 1, 2, 1, 40, 1, 22], "5,1,1": [5, 1, 1, 63]}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread: these are tiny arrays, and on a shared 2-core machine a
    parallel region's start-up (HF's depthwise ``F.conv1d`` on a new length: 0.5 s per
    call with 2 threads under load, 1 ms with one) dwarfs the arithmetic. Restored after."""
    was = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(was)


def nmse(a, b) -> float:
    """sum((a - b)^2) / sum(b^2); inf where either side is not finite (NaN / Inf never pass)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return float("inf")
    return float(np.sum((a - b) ** 2) / max(np.sum(b**2), 1e-300))


# ------------------------------------------------------------------------ HF side


def _randomize(module, seed: int, skip=()):
    """Seeded random weights on every parameter: projections ~ 1/sqrt(fan_in), norm
    weights around 1, biases / dt_bias ~ 0.5, conv kernels ~ 0.5."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in skip:
                continue
            if "norm" in name and p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            elif "conv" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) / p.shape[-1] ** 0.5)
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))


@dataclasses.dataclass
class Kind:
    """One kind's HF module, its input norm and its impl description + weights."""

    name: str
    cfg: RecurrentConfig
    weights: dict
    module: object
    norm: object
    hf_cfg: object
    bound: float
    hf_call: object = None  # (module, normed, cache) -> out
    new_cache: object = None
    hf_states: object = None  # cache -> (conv [C, K-1] | None, rec canonical | None)
    residual: object = None  # (x, normed, out) -> resid
    # HF mamba_selective_scan takes no initial state: a multi-row call after the first
    # restarts the SSM state from zero (its multi-row continuation is HF's divergence)
    drops_state_on_multirow: bool = False

    def hf_run(self, x: np.ndarray, chunks, dtype=torch.float64):
        """HF on ``chunks`` (None: one call WITHOUT a cache, HF's plain forward)."""
        xt = torch.as_tensor(x, dtype=torch.float64)[None].to(dtype)
        mod, norm = self.module.to(dtype), self.norm.to(dtype)
        outs, states, normed_all = [], [], []
        with torch.no_grad():
            if chunks is None:
                normed = norm(xt)
                outs.append(self.hf_call(mod, normed, None))
                normed_all.append(normed)
            else:
                cache, a = self.new_cache(), 0
                for c in chunks:
                    normed = norm(xt[:, a:a + c])
                    outs.append(self.hf_call(mod, normed, cache))
                    normed_all.append(normed)
                    states.append(self.hf_states(cache))
                    a += c
        self.module.double(), self.norm.double()
        out = torch.cat(outs, 1)[0].double().numpy()
        normed = torch.cat(normed_all, 1)[0].double().numpy()
        return out, normed, states


def _lin_cache_states(cache):
    layer = cache.layers[0]
    conv = layer.conv_states[0]
    rec = layer.recurrent_states[0]
    # clone: HF updates its cache tensors in place (copy_), a view would alias the last state
    return (None if conv is None else conv[0, :, 1:].clone().double().numpy(),
            None if rec is None else rec[0].clone().double().numpy())


def _call_mixer(mod, normed, cache):
    return mod(normed, cache=cache)


def gdn_kind(seed=0, variant="qwen3_next", n_k=2, n_v=4, dk=8, dv=8, conv_k=4, head_map="grouped"):
    """qwen3_next (fused in_proj_qkvz / in_proj_ba, interleaved per key head) or qwen3_5
    (split in_proj_qkv / z / b / a), to impl's per-role weights."""
    from transformers import DynamicCache

    if variant == "qwen3_next":
        from transformers import Qwen3NextConfig as Cfg
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as Mod
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm as Norm
    else:
        from transformers import Qwen3_5TextConfig as Cfg
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet as Mod
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm as Norm
    hid = 32
    hf = Cfg(hidden_size=hid, num_hidden_layers=1, layer_types=["linear_attention"], linear_num_key_heads=n_k,
             linear_num_value_heads=n_v, linear_key_head_dim=dk, linear_value_head_dim=dv,
             linear_conv_kernel_dim=conv_k, num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=16,
             rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    mod = Mod(hf, 0).double()
    _randomize(mod, seed, skip=("A_log",))
    norm = Norm(hid, eps=hf.rms_norm_eps).double()
    _randomize(norm, seed + 1)
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    r = n_v // n_k
    if variant == "qwen3_next":
        # HF fix_query_key_value_ordering: [q_h | k_h | v_h (r heads) | z_h (r heads)] per key head h
        qkvz = p["in_proj_qkvz.weight"].reshape(n_k, 2 * dk + 2 * r * dv, hid)
        q, k = qkvz[:, :dk], qkvz[:, dk:2 * dk]
        v, z = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
        w_in = np.concatenate([q.reshape(-1, hid), k.reshape(-1, hid), v.reshape(-1, hid)])
        w_z = z.reshape(-1, hid)
        ba = p["in_proj_ba.weight"].reshape(n_k, 2 * r, hid)
        w_beta, w_decay = ba[:, :r].reshape(-1, hid), ba[:, r:].reshape(-1, hid)
    else:
        w_in, w_z = p["in_proj_qkv.weight"], p["in_proj_z.weight"]
        w_beta, w_decay = p["in_proj_b.weight"], p["in_proj_a.weight"]
    weights = {"attn_norm": norm.weight.detach().numpy().copy(), "w_in": w_in, "w_z": w_z, "w_beta": w_beta,
               "w_decay": w_decay, "dt_bias": p["dt_bias"], "A_log": p["A_log"], "conv": p["conv1d.weight"][:, 0],
               "out_norm": p["norm.weight"], "wo": p["out_proj.weight"]}
    cfg = RecurrentConfig.of("gated_delta_net", hidden_size=hid, n_k_heads=n_k, n_v_heads=n_v, k_dim=dk, v_dim=dv,
                             conv_kernel=conv_k, out_norm_eps=hf.rms_norm_eps, qk_norm_eps=1e-6,
                             input_norm=NormSpec("rms1p", hf.rms_norm_eps))
    if head_map == "tiled":
        cfg, weights = cfg.replace(head_map="tiled"), tile_v_heads(weights, n_k, r, dk, dv)
    return Kind(variant, cfg, weights, mod, norm, hf, F32_NMSE, _call_mixer, lambda: DynamicCache(config=hf),
                _lin_cache_states)


def tile_v_heads(w: dict, n_k: int, r: int, dk: int, dv: int) -> dict:
    """Value heads grouped (HF: head g*r + i reads key head g) -> tiled (i*Hk + g reads g % Hk),
    across every tensor that carries a value-head axis -- llama.cpp conversion/qwen.py
    ``_LinearAttentionVReorderBase._reorder_v_heads`` (Qwen3_5TextModel)."""

    def perm(a, axis, width):
        sh = list(a.shape)
        a = a.reshape(sh[:axis] + [n_k, r, width] + sh[axis + 1:])
        a = np.swapaxes(a, axis, axis + 1)
        return np.ascontiguousarray(a).reshape(sh)

    out = dict(w)
    qk = 2 * n_k * dk
    out["w_in"] = np.concatenate([w["w_in"][:qk], perm(w["w_in"][qk:], 0, dv)])
    out["conv"] = np.concatenate([w["conv"][:qk], perm(w["conv"][qk:], 0, dv)])
    out["w_z"] = perm(w["w_z"], 0, dv)
    for name in ("w_beta", "w_decay"):
        out[name] = perm(w[name], 0, 1)
    for name in ("A_log", "dt_bias"):
        out[name] = perm(w[name], 0, 1)
    out["wo"] = perm(w["wo"], 1, dv)
    return out


def short_conv_kind(seed=0, conv_bias=True, conv_k=3):
    """lfm2: in_proj -> B | C | x; conv(B * x); C * conv; out_proj (HF Lfm2ShortConv)."""
    from transformers import DynamicCache, Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2RMSNorm, Lfm2ShortConv

    hid = 32
    hf = Lfm2Config(hidden_size=hid, num_hidden_layers=1, layer_types=["conv"], conv_bias=conv_bias,
                    conv_L_cache=conv_k, num_attention_heads=2, num_key_value_heads=1, vocab_size=16,
                    intermediate_size=64, norm_eps=1e-5)
    torch.manual_seed(seed)
    mod = Lfm2ShortConv(hf, 0).double()
    _randomize(mod, seed)
    norm = Lfm2RMSNorm(hid, eps=hf.norm_eps).double()
    _randomize(norm, seed + 1)
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    w_in = p["in_proj.weight"]
    weights = {"attn_norm": norm.weight.detach().numpy().copy(), "w_bx": w_in[:hid], "w_z": w_in[hid:2 * hid],
               "w_in": w_in[2 * hid:], "conv": p["conv.weight"][:, 0], "wo": p["out_proj.weight"]}
    if conv_bias:  # HF-only: llama.cpp's lfm2 has no conv / projection bias tensors
        b = p["in_proj.bias"]
        weights.update(b_bx=b[:hid], b_z=b[hid:2 * hid], b_in=b[2 * hid:], conv_b=p["conv.bias"],
                       bo=p["out_proj.bias"])
    cfg = RecurrentConfig.of("short_conv", hidden_size=hid, conv_kernel=conv_k, conv_bias=conv_bias,
                             in_bias=conv_bias, out_bias=conv_bias, input_norm=NormSpec("rms", hf.norm_eps))
    return Kind("lfm2", cfg, weights, mod, norm, hf, F64_NMSE, _call_mixer, lambda: DynamicCache(config=hf),
                _lin_cache_states)


def kda_kind(seed=0, heads=2, dim=8, conv_k=4):
    """kimi_linear: q/k/v_proj through one conv; per-key-channel decay f_b(f_a(x)); beta;
    o_norm(y) * sigmoid(g_b(g_a(x))) (HF KimiLinearDeltaAttention)."""
    from transformers import DynamicCache, KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention, KimiLinearRMSNorm

    hid = 32
    hf = KimiLinearConfig(hidden_size=hid, num_hidden_layers=1, layer_types=["linear_attention"],
                          mlp_layer_types=["dense"], linear_num_heads=heads, linear_head_dim=dim,
                          linear_conv_kernel_dim=conv_k, num_attention_heads=2, num_key_value_heads=2,
                          vocab_size=16, intermediate_size=64, rms_norm_eps=1e-5, kv_lora_rank=8,
                          qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8, pad_token_id=None,
                          bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    mod = KimiLinearDeltaAttention(hf, 0).double()
    _randomize(mod, seed)
    norm = KimiLinearRMSNorm(hid, eps=hf.rms_norm_eps).double()
    _randomize(norm, seed + 1)
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    weights = {"attn_norm": norm.weight.detach().numpy().copy(),
               "w_in": np.concatenate([p["q_proj.weight"], p["k_proj.weight"], p["v_proj.weight"]]),
               "conv": p["conv1d.weight"][:, 0], "w_decay_a": p["forget_gate.f_a_proj.weight"],
               "w_decay": p["forget_gate.f_b_proj.weight"], "dt_bias": p["forget_gate.dt_bias"],
               "A_log": p["forget_gate.A_log"].reshape(heads), "w_beta": p["b_proj.weight"],
               "w_z_a": p["g_a_proj.weight"], "w_z": p["g_b_proj.weight"], "out_norm": p["o_norm.weight"],
               "wo": p["o_proj.weight"]}
    cfg = RecurrentConfig.of("kimi_delta", hidden_size=hid, n_k_heads=heads, n_v_heads=heads, k_dim=dim, v_dim=dim,
                             conv_kernel=conv_k, decay_rank=dim, z_rank=dim, out_norm_eps=hf.rms_norm_eps,
                             qk_norm_eps=1e-6, input_norm=NormSpec("rms", hf.rms_norm_eps))
    return Kind("kimi_linear", cfg, weights, mod, norm, hf, F32_NMSE, _call_mixer, lambda: DynamicCache(config=hf),
                _lin_cache_states)


def mamba2_kind(seed=0, heads=4, head_dim=8, groups=2, state=8, conv_k=4, use_bias=True, chunk=32):
    """mamba2: in_proj -> z | xBC | dt; conv + silu over xBC; the SSD scan (dt = softplus(dt +
    dt_bias), dA = exp(dt * A), write dt * x (x) B, read C, D skip); y * silu(z), grouped RMS
    (HF Mamba2Mixer.torch_forward, MambaRMSNormGated)."""
    from transformers import DynamicCache, Mamba2Config
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer, Mamba2RMSNorm

    hid = 32
    hf = Mamba2Config(hidden_size=hid, num_hidden_layers=1, num_heads=heads, head_dim=head_dim, n_groups=groups,
                      state_size=state, expand=heads * head_dim // hid, conv_kernel=conv_k, use_bias=use_bias,
                      use_conv_bias=True, chunk_size=chunk, vocab_size=16, layer_norm_epsilon=1e-5)
    torch.manual_seed(seed)
    mod = Mamba2Mixer(hf, 0).double()
    _randomize(mod, seed)
    norm = Mamba2RMSNorm(hid, eps=hf.layer_norm_epsilon).double()
    _randomize(norm, seed + 1)
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    di, cd = heads * head_dim, heads * head_dim + 2 * groups * state
    w = p["in_proj.weight"]  # HF `projected_states.split([intermediate, conv_dim, num_heads])`
    weights = {"attn_norm": norm.weight.detach().numpy().copy(), "w_z": w[:di], "w_in": w[di:di + cd],
               "w_decay": w[di + cd:], "conv": p["conv1d.weight"][:, 0], "conv_b": p["conv1d.bias"],
               "dt_bias": p["dt_bias"], "A_log": p["A_log"], "D": p["D"], "out_norm": p["norm.weight"],
               "wo": p["out_proj.weight"]}
    if use_bias:
        b = p["in_proj.bias"]
        weights.update(b_z=b[:di], b_in=b[di:di + cd], b_decay=b[di + cd:], bo=p["out_proj.bias"])
    cfg = RecurrentConfig.of("mamba2", hidden_size=hid, n_k_heads=groups, n_v_heads=heads, k_dim=state,
                             v_dim=head_dim, conv_kernel=conv_k, in_bias=use_bias, out_bias=use_bias,
                             out_norm_groups=groups, out_norm_eps=hf.layer_norm_epsilon,
                             dt_limit=tuple(hf.time_step_limit), input_norm=NormSpec("rms", hf.layer_norm_epsilon))
    return Kind("mamba2", cfg, weights, mod, norm, hf, F32_NMSE, _call_mixer, lambda: DynamicCache(config=hf),
                _lin_cache_states)


def mamba1_kind(seed=0, variant="mamba", state=8, conv_k=4, use_bias=True, dt_rank=4):
    """mamba / falcon_mamba: in_proj -> x | z; conv + silu; x_proj -> dt | B | C (falcon_mamba:
    weightless RMS of each, mixer_rms_eps); dt_proj; the selective scan with a per-(channel,
    state) decay; D skip; y * silu(z) (HF MambaMixer / FalconMambaMixer, torch path)."""
    from transformers import DynamicCache

    if variant == "mamba":
        from transformers import MambaConfig as Cfg
        from transformers.models.mamba.modeling_mamba import MambaMixer as Mod
        from transformers.models.mamba.modeling_mamba import MambaRMSNorm as Norm
    else:
        from transformers import FalconMambaConfig as Cfg
        from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaMixer as Mod
        from transformers.models.falcon_mamba.modeling_falcon_mamba import FalconMambaRMSNorm as Norm
    hid = 32
    hf = Cfg(hidden_size=hid, num_hidden_layers=1, state_size=state, expand=2, conv_kernel=conv_k, use_bias=use_bias,
             use_conv_bias=True, time_step_rank=dt_rank, vocab_size=16, layer_norm_epsilon=1e-5, use_mambapy=False)
    torch.manual_seed(seed)
    # initialize_mixer_weights=False as the HF blocks pass it (FalconMambaMixer's own init reads
    # dt_layernorm before __init__ has made it: AttributeError); every parameter is seeded below
    mod = Mod(hf, 0, initialize_mixer_weights=False).double()
    _randomize(mod, seed)
    norm = Norm(hid, eps=hf.layer_norm_epsilon).double()
    _randomize(norm, seed + 1)
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    di = 2 * hid
    w = p["in_proj.weight"]  # HF `projected_states.chunk(2, dim=1)`: x | z
    weights = {"attn_norm": norm.weight.detach().numpy().copy(), "w_in": w[:di], "w_z": w[di:],
               "conv": p["conv1d.weight"][:, 0], "conv_b": p["conv1d.bias"], "w_x_proj": p["x_proj.weight"],
               "w_dt": p["dt_proj.weight"], "dt_bias": p["dt_proj.bias"], "A_log": p["A_log"], "D": p["D"],
               "wo": p["out_proj.weight"]}
    if use_bias:
        weights.update(b_in=p["in_proj.bias"][:di], b_z=p["in_proj.bias"][di:], bo=p["out_proj.bias"])
    bc = None if variant == "mamba" else NormSpec("rms", hf.mixer_rms_eps)  # weightless: no dt/b/c_norm weights
    cfg = RecurrentConfig.of("mamba1", hidden_size=hid, n_v_heads=di, k_dim=state, dt_rank=dt_rank,
                             conv_kernel=conv_k, in_bias=use_bias, out_bias=use_bias, bc_norm=bc,
                             input_norm=NormSpec("rms", hf.layer_norm_epsilon))
    return Kind(variant, cfg, weights, mod, norm, hf, F32_NMSE, _call_mixer, lambda: DynamicCache(config=hf),
                _lin_cache_states, drops_state_on_multirow=True)


def lightning_kind(seed=0, heads=2, dim=8, layer_idx=1, n_layers=3, block=16, alpha=0.5, beta=1.5):
    """minimax: silu(qkv_proj) per head q | k | v; S = exp(-slope_h) S + k^T v, y = q S (no q
    scale, no norm); RMS over the row (eps 1e-6, not rms_norm_eps) * sigmoid(output_gate(x));
    out_proj; the decoder's residual is normed * alpha + branch * beta (HF
    MiniMaxLightningAttention, MiniMaxDecoderLayer)."""
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxCache, MiniMaxLightningAttention, MiniMaxRMSNorm

    hid = 32
    hf = MiniMaxConfig(hidden_size=hid, num_hidden_layers=n_layers, layer_types=["linear_attention"] * n_layers,
                       num_attention_heads=heads, num_key_value_heads=heads, head_dim=dim, block_size=block,
                       vocab_size=16, intermediate_size=64, rms_norm_eps=1e-5, linear_attn_alpha_factor=alpha,
                       linear_attn_beta_factor=beta)
    torch.manual_seed(seed)
    mod = MiniMaxLightningAttention(hf, layer_idx).double()
    _randomize(mod, seed)
    norm = MiniMaxRMSNorm(hid, eps=hf.rms_norm_eps).double()
    _randomize(norm, seed + 1)
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    qkv = p["qkv_proj.weight"].reshape(heads, 3, dim, hid)  # HF `reshape(..., H, 3 * D)` then split per head
    weights = {"attn_norm": norm.weight.detach().numpy().copy(),
               "w_in": np.concatenate([qkv[:, i].reshape(heads * dim, hid) for i in range(3)]),
               "w_z": p["output_gate.weight"], "out_norm": p["norm.weight"], "wo": p["out_proj.weight"]}
    slopes = tuple(float(v) for v in mod.slope_rate.reshape(-1))  # HF's own (float32-rounded) slopes
    cfg = RecurrentConfig.of("lightning", hidden_size=hid, n_k_heads=heads, n_v_heads=heads, k_dim=dim, v_dim=dim,
                             decay_slopes=slopes, out_norm_eps=mod.norm.variance_epsilon, residual="normed",
                             residual_alpha=alpha, residual_beta=beta, input_norm=NormSpec("rms", hf.rms_norm_eps))

    def call(m, normed, cache):
        return m(normed, None, None, cache=cache)[0]

    def states(cache):
        return None, cache.linear_cache[layer_idx][0].clone().double().numpy()

    return Kind("minimax", cfg, weights, mod, norm, hf, F32_NMSE, call, MiniMaxCache, states,
                residual=lambda x, normed, out: normed * alpha + out * beta)


KINDS = {
    "qwen3_next": lambda seed=0, **kw: gdn_kind(seed, "qwen3_next", **kw),
    "qwen3_5": lambda seed=0, **kw: gdn_kind(seed, "qwen3_5", **kw),
    "lfm2": lambda seed=0, **kw: short_conv_kind(seed, **kw),
    "kimi_linear": lambda seed=0, **kw: kda_kind(seed, **kw),
    "mamba2": lambda seed=0, **kw: mamba2_kind(seed, **kw),
    "mamba": lambda seed=0, **kw: mamba1_kind(seed, "mamba", **kw),
    "falcon_mamba": lambda seed=0, **kw: mamba1_kind(seed, "falcon_mamba", **kw),
    "minimax": lambda seed=0, **kw: lightning_kind(seed, **kw),
}


def impl_run(kind: Kind, x: np.ndarray, chunks, backend=None, kv="decode", cfg=None, others=()):
    be = backend or Backend("numpy", "cpu", "float64")
    layer = load_layer(cfg or kind.cfg, kind.weights, be)
    outs, traces, steps = run_layer(layer, [x, *others], kv, None if chunks is None else
                                    [chunks] + [[o.shape[0]] for o in others])
    return outs[0], traces[0].assemble(), steps


def _x(seed: int, n: int = T, hid: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, hid))


# ------------------------------------------------------------------------ tests


def teacher_forced(kind: Kind, normed: np.ndarray, chunks):
    """impl's block on HF's own normed rows (the norm switched off): the layer judged on
    its own, as the harness feeds each layer the reference's input. HF's RMS norms all
    compute in float32 (``hidden_states.to(torch.float32)``), even in a float64 module,
    so the norm is held to the float32 bound apart (``attn_in``)."""
    return impl_run(kind, normed, chunks, cfg=kind.cfg.replace(input_norm=NormSpec("none")))


@pytest.mark.parametrize("name", list(KINDS))
def test_matches_hf_on_every_schedule(name):
    kind = KINDS[name]()
    x = _x(1)
    # one call without a cache: HF's plain forward; impl from the layer input, norm included
    want, normed, _ = kind.hf_run(x, None)
    _, tr, _ = impl_run(kind, x, None)
    assert nmse(tr["attn_in"], normed) < F32_NMSE  # HF's norms: float32 inside, even in float64
    assert nmse(tr["attn_out"], want) < F32_NMSE
    resid = (kind.residual or (lambda x, normed, out: x + out))(x, normed, want)  # the HF decoder layer's
    assert nmse(tr["resid_mid"], resid) < F32_NMSE
    _, tr, _ = teacher_forced(kind, normed, None)
    e = nmse(tr["attn_out"], want)
    print(f"{name} prefill attn_out nmse {e:.2e} max_abs {np.abs(tr['attn_out'] - want).max():.2e}")
    assert e < kind.bound
    prefill = want
    for sched in ("decode", "mixed", "5,1,1"):
        chunks = SCHEDULES[sched]
        want, normed, states = kind.hf_run(x, chunks)
        _, tr, _ = teacher_forced(kind, normed, chunks)
        if kind.drops_state_on_multirow and any(c > 1 for c in chunks[1:]):
            # HF's own schedule diverges from HF's one call (a finding, not rounding); impl
            # continues the state and matches HF's one call; only the conv states compare
            hf_drift = nmse(want, prefill)
            print(f"{name} {sched}: HF's multi-row continuation vs HF's one call nmse {hf_drift:.2e}")
            assert hf_drift > 1e3 * kind.bound
            assert nmse(tr["attn_out"], prefill) < kind.bound
            # the state after the last call == HF's state after ONE call over all rows
            one_call_state = kind.hf_run(x, [len(x)])[2][0][1]
            assert nmse(tr["state_rec"][-1], one_call_state) < kind.bound
            states = [(conv, None) for conv, _ in states]
            want = prefill
        e = nmse(tr["attn_out"], want)
        assert e < kind.bound, (sched, e)
        assert tr["state_conv" if "state_conv" in tr else "state_rec"].shape[0] == len(chunks)
        for i, (conv, rec) in enumerate(states):
            if conv is not None:
                assert nmse(tr["state_conv"][i], conv) < kind.bound, (sched, i)
            if rec is not None:
                assert nmse(tr["state_rec"][i], rec) < kind.bound, (sched, i)
        st = ", ".join(f"{n} nmse {nmse(tr[n][-1], states[-1][i]):.2e}" for i, n in enumerate(("state_conv", "state_rec"))
                       if n in tr and states[-1][i] is not None)
        print(f"{name} {sched} attn_out nmse {e:.2e} {st}")


@pytest.mark.parametrize("name", list(KINDS))
def test_every_schedule_and_scan_gives_the_same_rows(name):
    """Prefill in one call == one row per call == mixed chunks == 5,1,1, in float64 within
    rounding, and the chunked (WY) form of the scan == the sequential one."""
    kind = KINDS[name]()
    x = _x(2)
    _, tr0, _ = impl_run(kind, x, None)
    forms = [kind.cfg] + ([kind.cfg.replace(scan="chunked", chunk_size=16)] if kind.cfg.has_recurrence else [])
    for cfg in forms:
        for sched, chunks in SCHEDULES.items():
            _, tr, _ = impl_run(kind, x, chunks, cfg=cfg)
            for probe in ("attn_out", "resid_mid", "rec_conv", "rec_out"):
                if probe in tr0:
                    assert nmse(tr[probe], tr0[probe]) < 1e-24, (cfg.scan, sched, probe)
            for st in ("state_conv", "state_rec"):
                if st in tr0:
                    assert nmse(tr[st][-1], tr0[st][-1]) < 1e-24, (cfg.scan, sched, st)


@pytest.mark.parametrize("name", list(KINDS))
def test_kv_backings_agree_bit_for_bit_and_a_sequence_is_its_own(name):
    """Decode / Batched / Paged hold the state per sequence: the same bits in all three,
    and a sequence batched with others of different content, length and schedule gets
    exactly what it gets alone."""
    kind = KINDS[name]()
    be = Backend("torch", "cpu", "float32")
    xs = [_x(3, 23), _x(4, 17), _x(5, 9)]
    plans = [[5, 1, 1, 16], [1] * 17, [9]]
    layer = load_layer(kind.cfg, kind.weights, be)
    runs = {}
    for mode in ("decode", "batched", "paged"):
        outs, traces, steps = run_layer(layer, xs, mode, plans)
        runs[mode] = (outs, [t.assemble() for t in traces])
        if mode == "paged":
            assert steps[0].pool.free == [] and all(s.seq.block_table == [] for s in steps)  # no pages for no KV
            assert len({id(s.seq.recurrent) for s in steps}) == 3  # a state per sequence
    alone = run_layer(layer, xs[:1], "decode", plans[:1])
    for mode, (outs, trs) in runs.items():
        for s in range(3):
            np.testing.assert_array_equal(outs[s], runs["decode"][0][s])
            for probe, arr in runs["decode"][1][s].items():
                np.testing.assert_array_equal(trs[s][probe], arr, err_msg=f"{mode} seq {s} {probe}")
        np.testing.assert_array_equal(outs[0], alone[0][0])


@pytest.mark.parametrize("name", list(KINDS))
def test_numpy_and_torch_agree_and_bfloat16_is_close(name):
    kind = KINDS[name]()
    x = _x(6)
    chunks = SCHEDULES["mixed"]
    f64 = {b: impl_run(kind, x, chunks, Backend(b, "cpu", "float64"))[1] for b in ("numpy", "torch")}
    f32 = {b: impl_run(kind, x, chunks, Backend(b, "cpu", "float32"))[1] for b in ("numpy", "torch")}
    for probe in f64["numpy"]:
        assert nmse(f64["torch"][probe], f64["numpy"][probe]) < 1e-24, probe
        assert nmse(f32["torch"][probe], f32["numpy"][probe]) < 1e-10, probe
    # bfloat16: judged against the float64 oracle, relative to HF's own bfloat16 run's distance to it
    ref_chunks = None if kind.drops_state_on_multirow else chunks  # HF's one call where its schedule drifts
    oracle, _, _ = kind.hf_run(x, ref_chunks)
    bf = impl_run(kind, x, chunks, Backend("torch", "cpu", "bfloat16"))[1]
    assert np.isfinite(bf["attn_out"]).all() and np.isfinite(bf["state_rec" if "state_rec" in bf else "state_conv"]).all()
    hf_bf, _, _ = kind.hf_run(x, ref_chunks, dtype=torch.bfloat16)
    e_impl, e_hf = nmse(bf["attn_out"], oracle), nmse(hf_bf, oracle)
    print(f"{name} bf16 attn_out nmse vs f64: impl {e_impl:.2e}, HF bf16 {e_hf:.2e}")
    assert e_impl < max(2 * e_hf, 1e-5)
    # float16 (HF's CPU half path is not judged here): finite, and at float16's rounding
    f16 = impl_run(kind, x, chunks, Backend("torch", "cpu", "float16"))[1]
    assert nmse(f16["attn_out"], f64["numpy"]["attn_out"]) < 1e-4


def hf_distance(kind: Kind, x: np.ndarray, sched: str) -> float:
    """The largest NMSE of impl against HF over attn_out and every state snapshot."""
    chunks = SCHEDULES[sched]
    want, normed, states = kind.hf_run(x, chunks)
    _, tr, _ = teacher_forced(kind, normed, chunks)
    errs = [nmse(tr["attn_out"], want)]
    for i, (conv, rec) in enumerate(states):
        if conv is not None:
            errs.append(nmse(tr["state_conv"][i], conv))
        if rec is not None:
            errs.append(nmse(tr["state_rec"][i], rec))
    return max(errs)


def _shift_conv_state(monkeypatch, kind):
    """The conv state handed to the next call is one row stale (shifted by one)."""
    import impl.recurrent as rec

    orig = rec._causal_conv

    def bad(be, layer, rows, slot):
        out = orig(be, layer, rows, slot)
        if slot.conv.shape[0] > 1:
            slot.conv = be.xp.concat([slot.conv[:1], slot.conv[:-1]], axis=0)
        return out

    monkeypatch.setattr(rec, "_causal_conv", bad)


def _flip_decay_sign(monkeypatch, kind):
    """exp(+g) for exp(g): the state grows instead of decaying (inf at once for a steep decay)."""
    import impl.recurrent as rec

    if kind.cfg.decay_param == "slope":
        # lightning's decay is one host array (RecurrentLayer.log_decay) that the rows' g and the
        # state's carried multipliers (recurrent_scan.carried_decays) both read: flip it there
        orig_load = rec.RecurrentLayer.load.__func__

        def load(cls, cfg, weights, backend):
            layer = orig_load(cls, cfg, weights, backend)
            return dataclasses.replace(layer, log_decay=-layer.log_decay)

        monkeypatch.setattr(rec.RecurrentLayer, "load", classmethod(load))
        return
    orig = rec._recurrence_inputs

    def bad(layer, normed, conv_out, put):
        q, k, v, beta, g, vw, skip = orig(layer, normed, conv_out, put)
        return q, k, v, beta, -g, vw, skip

    monkeypatch.setattr(rec, "_recurrence_inputs", bad)


def _beta_not_squashed(monkeypatch, kind):
    import impl.recurrent as rec

    orig = rec._recurrence_inputs

    def bad(layer, normed, conv_out, put):
        q, k, v, beta, g, vw, skip = orig(layer, normed, conv_out, put)
        xp = layer.backend.xp
        return q, k, v, xp.log(beta / (1 - beta)), g, vw, skip  # the logit, not its sigmoid

    monkeypatch.setattr(rec, "_recurrence_inputs", bad)


def _gate_order_swapped(monkeypatch, kind):
    """mamba2's gate-then-norm read as norm-then-gate (falcon_h1's norm_before_gate=True)."""
    kind.cfg = kind.cfg.replace(gate_order="norm_then_gate")


BUGS = {"conv_state_shifted": _shift_conv_state, "decay_sign_flipped": _flip_decay_sign,
        "beta_not_squashed": _beta_not_squashed, "gate_order_swapped": _gate_order_swapped}
BUG_KINDS = {"conv_state_shifted": ["qwen3_next", "lfm2", "mamba2", "mamba"],
             "decay_sign_flipped": ["qwen3_next", "kimi_linear", "mamba2", "mamba", "minimax"],
             "beta_not_squashed": ["qwen3_next", "kimi_linear"], "gate_order_swapped": ["mamba2"]}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a growing state overflows: that is the point
@pytest.mark.parametrize("bug,name", [(b, k) for b, ks in BUG_KINDS.items() for k in ks])
def test_planted_bug_is_caught(bug, name, monkeypatch):
    kind = KINDS[name]()
    x = _x(7)
    clean = hf_distance(kind, x, "decode")
    assert clean < kind.bound
    BUGS[bug](monkeypatch, kind)
    bad = hf_distance(kind, x, "decode")
    print(f"{bug} on {name}: nmse {clean:.1e} clean -> {bad:.1e} planted")
    assert bad > 1e3 * kind.bound, bad
    if bug == "conv_state_shifted":  # a state bug only shows between calls: one call still passes
        want, normed, _ = kind.hf_run(x, None)
        assert nmse(teacher_forced(kind, normed, None)[1]["attn_out"], want) < kind.bound


def test_v_head_tiling_is_a_named_parameter():
    """qwen3_5's llama.cpp layout: V heads reordered grouped -> tiled (the converter's
    _reorder_v_heads) read key head h % Hk (head_map='tiled') and compute the same
    branch; the same weights under the other map do not."""
    grouped = KINDS["qwen3_5"]()
    tiled = KINDS["qwen3_5"](head_map="tiled")
    x = _x(8)
    out_g, tr_g, _ = impl_run(grouped, x, SCHEDULES["mixed"])
    out_t, tr_t, _ = impl_run(tiled, x, SCHEDULES["mixed"])
    assert nmse(out_t, out_g) < 1e-26
    hk, hv = grouped.cfg.n_k_heads, grouped.cfg.n_v_heads
    order = [i * hk + g for g in range(hk) for i in range(hv // hk)]  # grouped head g*r+i sits at tiled i*Hk+g
    np.testing.assert_allclose(tr_t["state_rec"][:, order], tr_g["state_rec"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(tr_t["rec_v"][:, order], tr_g["rec_v"], rtol=1e-12, atol=1e-14)
    wrong = impl_run(tiled, x, SCHEDULES["mixed"], cfg=tiled.cfg.replace(head_map="grouped"))[0]
    assert nmse(wrong, out_g) > 1e-6


def test_probe_and_state_names_and_shapes():
    kind = KINDS["qwen3_5"]()
    _, tr, _ = impl_run(kind, _x(9, 12), [5, 1, 1, 5])
    c = kind.cfg
    want = {"layer_in": (12, 32), "attn_in": (12, 32), "rec_conv_in": (12, c.conv_channels),
            "rec_conv": (12, c.conv_channels), "rec_z": (12, 4, 8), "rec_q": (12, 2, 8), "rec_k": (12, 2, 8),
            "rec_v": (12, 4, 8), "rec_beta": (12, 4), "rec_decay": (12, 4), "rec_out": (12, 4, 8),
            "attn_branch": (12, 32), "attn_out": (12, 32), "resid_mid": (12, 32),
            "state_conv": (4, c.conv_channels, 3), "state_rec": (4, 4, 8, 8)}
    assert {k: v.shape for k, v in tr.items()} == want
    assert set(RECURRENT_PROBES) | set(RECURRENT_STATES) == set(want)
    probes = [p for p in tr if not p.startswith("state_")]
    assert probes == [p for p in RECURRENT_PROBES if p in tr]  # recorded in RECURRENT_PROBES' (dataflow) order
    # q and k as they enter the recurrence: unit-norm (the Dk ** -0.5 q scale is the recurrence's read, after)
    np.testing.assert_allclose(np.linalg.norm(tr["rec_k"], axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(tr["rec_q"], axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("kw,msg", [
    (dict(conv_kernel=0), "conv_kernel=0"),
    (dict(n_k_heads=3), "n_k_heads=3 does not divide n_v_heads=4"),
    (dict(kind="kimi_delta", v_dim=4), "k_dim=8 != v_dim=4"),
    (dict(conv_activation="gelu"), "unknown conv_activation 'gelu'"),
    (dict(kind="mamba3"), "unknown recurrent kind 'mamba3'"),
    (dict(head_map="striped"), "unknown head_map"),
    (dict(out_norm_groups=3), "out_norm_groups=3 does not divide"),
    (dict(decay="per_key"), "decay / decay_param / update"),
    (dict(scan="parallel"), "unknown scan"),
])
def test_config_refuses_in_one_line(kw, msg):
    base = dict(kind="gated_delta_net", hidden_size=32, n_k_heads=2, n_v_heads=4, k_dim=8, v_dim=8)
    fields = {**base, **kw}
    kind = fields.pop("kind")
    with pytest.raises(ConfigError, match=msg) as e:
        if kind in ("gated_delta_net", "kimi_delta"):
            RecurrentConfig.of(kind, **fields)
        else:
            RecurrentConfig(kind=kind, **fields)
    assert "\n" not in str(e.value)


def test_weights_are_checked_against_the_config():
    kind = KINDS["qwen3_5"]()
    be = Backend()
    w = dict(kind.weights)
    w["conv"] = w["conv"][:, :3]
    with pytest.raises(ConfigError, match=r"weight conv has shape \(64, 3\), expected \(64, 4\)"):
        load_layer(kind.cfg, w, be)
    w = dict(kind.weights)
    del w["A_log"]
    with pytest.raises(ConfigError, match="lack 'A_log'"):
        load_layer(kind.cfg, w, be)
    with pytest.raises(ConfigError, match="'D' does not apply"):
        load_layer(kind.cfg, {**kind.weights, "D": np.ones(4)}, be)
    with pytest.raises(ConfigError, match="unknown recurrent weights"):
        load_layer(kind.cfg, {**kind.weights, "in_proj_qkvz": np.ones(4)}, be)


@pytest.mark.device
@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("scan", ["sequential", "chunked"])
def test_the_body_stays_on_the_device(name, scan):
    """On torch's data-less meta device under impl.device_guard: no host tensor, no pull to
    the host, no float64 on the device, in every backing (tests/test_device.py's rule)."""
    from impl.device_guard import DeviceGuard, GuardedBackend

    kind = KINDS[name]()
    if scan == "chunked" and not kind.cfg.has_recurrence:
        pytest.skip("short conv has no scan")
    layer = load_layer(kind.cfg.replace(scan=scan, chunk_size=4), kind.weights,
                       GuardedBackend("torch", "meta", "bfloat16"))
    for mode in ("decode", "batched", "paged"):
        with DeviceGuard("meta", forbid_float64=True) as g:
            outs, traces, _ = run_layer(layer, [_x(1, 9), _x(2, 7)], mode, [[5, 1, 1, 2], [7]])
        assert outs[0].shape == (9, kind.cfg.hidden_size) and g.ops > 50
        assert set(traces[0].assemble()) >= {"attn_out", "rec_conv" if kind.cfg.kind != "lightning" else "rec_out"}


def test_lightning_slopes_follow_each_references_rule():
    """HF get_slope_rate: factor 1 - il / (n_layers - 1 + 1e-5) + 1e-5; llama.cpp minimax-01.cpp
    slope_scale: 1 - il / (n_layers - 1) + 1e-5 -- the same but for the 1e-5 in the divisor."""
    from impl import lightning_slopes

    kind = KINDS["minimax"]()
    hf = np.asarray(kind.cfg.decay_slopes)
    ours = np.asarray(lightning_slopes(2, 1, 3, "hf"))
    np.testing.assert_allclose(ours, hf, rtol=1e-7)  # HF's buffer is float32
    ll = np.asarray(lightning_slopes(2, 1, 3, "llamacpp"))
    assert 0 < np.max(np.abs(ll / ours - 1)) < 1e-5
    with pytest.raises(ConfigError, match="n_layers >= 2"):
        lightning_slopes(2, 0, 1, "llamacpp")


# ------------------------------------------------------- probes against HF's internals
# HF exposes the recurrence's inputs and output only as the arguments and result of its
# scan function (a module global the forward calls by name): the test wraps it, and a
# forward pre-hook on out_proj gives what enters it (attn_branch).


def _l2(a, eps=1e-6):
    return a / np.sqrt((a * a).sum(-1, keepdims=True) + eps)


def _softplus(a):
    return np.where(a > 20, a, np.log1p(np.exp(np.minimum(a, 20))))


def _t(a):
    return a.detach().double().numpy()[0]


def _gdn_probes(args, kw, out, kind):
    q, k, v = (_t(a) for a in args[:3])
    n = q.shape[0]
    return {"rec_conv": np.concatenate([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], 1),
            "rec_q": _l2(q), "rec_k": _l2(k), "rec_v": v, "rec_beta": _t(kw["beta"]),
            "rec_decay": _t(kw["g"]), "rec_out": _t(out[0])}


def _mamba2_probes(args, kw, out, kind):
    x, dt, _, b, c = (_t(a) if i != 2 else None for i, a in enumerate(args[:5]))
    dt = np.clip(_softplus(dt + kw["dt_bias"].detach().double().numpy()), *kw["dt_limit"])
    n = x.shape[0]
    return {"rec_conv": np.concatenate([x.reshape(n, -1), b.reshape(n, -1), c.reshape(n, -1)], 1),
            "rec_q": c, "rec_k": b, "rec_v": x, "rec_decay": dt, "rec_out": _t(out)}


def _mamba1_probes(args, kw, out, kind):
    x, dt, _, b, c = (a.detach().double().numpy()[0].T if i != 2 else None for i, a in enumerate(args[:5]))
    return {"rec_conv": x, "rec_q": c, "rec_k": b, "rec_v": x,
            "rec_decay": _softplus(dt + kw["delta_bias"].detach().double().numpy()),
            "attn_branch": out.detach().double().numpy()[0].T}  # HF's scan returns y * silu(z)


def _conv_probes(args, kw, out, kind):
    return {"rec_conv_in": args[0].detach().double().numpy()[0].T, "rec_conv": out.detach().double().numpy()[0].T}


CAPTURE = {  # kind -> (modeling module, function the forward calls by name, probes from (args, kwargs, result))
    "qwen3_next": ("qwen3_next.modeling_qwen3_next", "torch_chunk_gated_delta_rule", _gdn_probes),
    "qwen3_5": ("qwen3_5.modeling_qwen3_5", "torch_chunk_gated_delta_rule", _gdn_probes),
    "kimi_linear": ("kimi_linear.modeling_kimi_linear", "chunk_kimi_delta_attention", _gdn_probes),
    "mamba2": ("mamba2.modeling_mamba2", "mamba2_chunk_scan", _mamba2_probes),
    "mamba": ("mamba.modeling_mamba", "mamba_selective_scan", _mamba1_probes),
    "falcon_mamba": ("falcon_mamba.modeling_falcon_mamba", "mamba_selective_scan", _mamba1_probes),
    "lfm2": ("lfm2.modeling_lfm2", "causal_conv1d_fn", _conv_probes),
    "minimax": None,  # the scan is inline in the forward: module hooks instead (below)
}


@pytest.mark.parametrize("name", list(KINDS))
def test_probes_match_hf_internals(name, monkeypatch):
    """Each probe in HF's own layout: impl (teacher-forced, one call) against what HF's scan
    function received and returned, and what HF's out_proj received."""
    import importlib

    kind = KINDS[name]()
    x = _x(10)
    seen, want = {}, {}
    if CAPTURE[name] is not None:
        modname, fn, _ = CAPTURE[name]
        mod = importlib.import_module(f"transformers.models.{modname}")
        orig = getattr(mod, fn)

        def spy(*args, **kw):
            out = orig(*args, **kw)
            seen.update(args=args, kw=kw, out=out)
            return out

        monkeypatch.setattr(mod, fn, spy)
    m = kind.module
    hooks = [getattr(m, "out_proj", None) or m.o_proj]
    hooks = [hooks[0].register_forward_pre_hook(lambda _, a: want.update(attn_branch=_t(a[0])))]
    if name == "minimax":  # the scan is inline: its output enters `norm`, its q | k | v leave qkv_proj
        h, d = kind.cfg.n_v_heads, kind.cfg.v_dim

        def qkv(_, a, o):
            q, k, v = np.split(_t(torch.nn.functional.silu(o)).reshape(-1, h, 3 * d), 3, axis=-1)
            want.update(rec_q=q, rec_k=k, rec_v=v)

        hooks += [m.norm.register_forward_pre_hook(lambda _, a: want.update(rec_out=_t(a[0]).reshape(-1, h, d))),
                  m.output_gate.register_forward_hook(lambda _, a, o: want.update(rec_z=_t(o).reshape(-1, h, d))),
                  m.qkv_proj.register_forward_hook(qkv)]
    try:
        _, normed, _ = kind.hf_run(x, None)
    finally:
        for hk in hooks:
            hk.remove()
    if seen:
        want.update(CAPTURE[name][2](seen["args"], seen["kw"], seen["out"], kind))
    _, tr, _ = teacher_forced(kind, normed, None)
    assert len(want) >= 2
    worst = {}
    for probe, arr in want.items():
        assert tr[probe].shape == arr.shape, (probe, tr[probe].shape, arr.shape)
        worst[probe] = nmse(tr[probe], arr)
        assert worst[probe] < kind.bound, (probe, worst[probe])
    print(name, " ".join(f"{p} {e:.1e}" for p, e in worst.items()))


def test_l2_eps_is_the_familys_choice_and_is_seen():
    """HF's l2norm fixes eps 1e-6; llama.cpp's build_gdn_l2_norm reads rms_norm_eps (1e-5 here).
    With small q / k (a conv kernel scaled down, so sum(k^2) is near eps) the two eps give
    different layers: HF's eps agrees with HF, the file's eps does not."""
    kind = KINDS["qwen3_5"]()
    with torch.no_grad():
        kind.module.conv1d.weight.mul_(1e-3)
    kind.weights = {**kind.weights, "conv": kind.module.conv1d.weight.detach().double().numpy()[:, 0]}
    x = _x(11)
    want, normed, _ = kind.hf_run(x, SCHEDULES["5,1,1"])
    hf_eps = teacher_forced(kind, normed, SCHEDULES["5,1,1"])[1]["attn_out"]
    assert nmse(hf_eps, want) < kind.bound
    kind.cfg = kind.cfg.replace(qk_norm_eps=kind.hf_cfg.rms_norm_eps)
    llama_eps = teacher_forced(kind, normed, SCHEDULES["5,1,1"])[1]["attn_out"]
    print(f"l2 eps 1e-6 vs rms_norm_eps 1e-5 on small q/k: nmse {nmse(llama_eps, want):.1e}")
    assert nmse(llama_eps, want) > 1e3 * kind.bound
