"""impl's recurrent prefill against HF's pure-torch gated delta-net at a real size.

A qwen3_next-like layer (16 key heads x 128, 32 value heads x 128, hidden 2048,
conv kernel 4) with seeded random weights, one sequence of 2048 tokens in ONE
call, torch float32 on the CPU: HF ``Qwen3NextGatedDeltaNet.forward`` without a
cache (its chunked WY path, ``torch_chunk_gated_delta_rule``, chunk 64, and
``causal_conv1d_fn``'s torch fallback) against impl's ``recurrent_block`` in
both scan forms (``RecurrentConfig.scan``: ``sequential``, ``chunked``), each
timed as the best of ``--repeat`` runs. Prints seconds, impl / HF (goal <= 2x)
and each form's NMSE against HF's output.

    PYTHONPATH=. python scripts/bench_recurrent.py [--tokens 2048] [--repeat 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch


def build(tokens: int, seed: int = 0):
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    from impl import Backend, NormSpec, RecurrentConfig

    hid, n_k, n_v, dk, dv, kk = 2048, 16, 32, 128, 128, 4
    hf = Qwen3NextConfig(hidden_size=hid, num_hidden_layers=1, layer_types=["linear_attention"],
                         linear_num_key_heads=n_k, linear_num_value_heads=n_v, linear_key_head_dim=dk,
                         linear_value_head_dim=dv, linear_conv_kernel_dim=kk, num_attention_heads=16,
                         num_key_value_heads=2, head_dim=128, vocab_size=16)
    torch.manual_seed(seed)
    mod = Qwen3NextGatedDeltaNet(hf, 0).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            if name == "A_log":
                continue  # HF's own init: log(uniform(0.01, 16))
            if p.ndim >= 2 and "conv" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            elif "norm" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    p = {k: v.detach().double().numpy() for k, v in mod.named_parameters()}
    r = n_v // n_k
    # HF fix_query_key_value_ordering: [q_h | k_h | v_h (r heads) | z_h (r heads)] per key head
    qkvz = p["in_proj_qkvz.weight"].reshape(n_k, 2 * dk + 2 * r * dv, hid)
    w_in = np.concatenate([qkvz[:, :dk].reshape(-1, hid), qkvz[:, dk:2 * dk].reshape(-1, hid),
                           qkvz[:, 2 * dk:2 * dk + r * dv].reshape(-1, hid)])
    ba = p["in_proj_ba.weight"].reshape(n_k, 2 * r, hid)
    weights = {"w_in": w_in, "w_z": qkvz[:, 2 * dk + r * dv:].reshape(-1, hid), "w_beta": ba[:, :r].reshape(-1, hid),
               "w_decay": ba[:, r:].reshape(-1, hid), "dt_bias": p["dt_bias"], "A_log": p["A_log"],
               "conv": p["conv1d.weight"][:, 0], "out_norm": p["norm.weight"], "wo": p["out_proj.weight"]}
    cfg = RecurrentConfig.of("gated_delta_net", hidden_size=hid, n_k_heads=n_k, n_v_heads=n_v, k_dim=dk, v_dim=dv,
                             conv_kernel=kk, out_norm_eps=hf.rms_norm_eps, input_norm=NormSpec("none"))
    x = np.random.default_rng(seed).standard_normal((tokens, hid)).astype(np.float32)
    return mod, cfg, weights, x, Backend("torch", "cpu", "float32")


def best(fn, repeat: int):
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared machine a multi-threaded MKL call under load "
                         "spends more time spinning than computing -- a batched solve ran 50x slower on 2 busy "
                         "cores -- and the ratio then measures the neighbours; 0: torch's default)")
    ap.add_argument("--forms", default="chunked,sequential")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    from impl.kv import ContiguousKv, Decode
    from impl.runner import load_layer

    mod, cfg, weights, x, be = build(a.tokens)
    xt = torch.from_numpy(x)[None]
    with torch.no_grad():
        t_hf, want = best(lambda: mod(xt)[0].numpy(), a.repeat)
    print(f"qwen3_next-like gated delta-net, {a.tokens} tokens, hidden 2048, 16 x 128 key / 32 x 128 value heads, "
          f"torch float32 cpu, {torch.get_num_threads()} threads")
    print(f"  HF Qwen3NextGatedDeltaNet.forward (torch_chunk_gated_delta_rule):  {t_hf:7.3f} s")
    for form in a.forms.split(","):
        layer = load_layer(cfg.replace(scan=form), weights, be)
        xb = be.asarray(x)

        def run(layer=layer, xb=xb):
            with torch.no_grad():
                out, _ = layer.block(xb, Decode(ContiguousKv(be)), None)
            return be.to_numpy(out)

        t, got = best(run, a.repeat if form == "chunked" else 1)
        e = float(np.sum((got - want) ** 2) / np.sum(want.astype(np.float64) ** 2))
        print(f"  impl recurrent_block, scan={form:10s}                             {t:7.3f} s   "
              f"impl/HF {t / t_hf:5.2f}x   nmse vs HF {e:.1e}")


if __name__ == "__main__":
    main()
