"""Mutants of the parallel SSM branch (falcon_h1, issue 25): the Mamba-2 block that
reads the attention's normed row and is summed into the attention's output (spec
``parallel_ssm_rows`` / ``add_parallel_ssm``; HF ``FalconH1DecoderLayer.forward``;
llama.cpp src/models/falcon-h1.cpp ``ggml_add(attn_out, ssm_out)``), and the muP
multipliers HF applies around both branches (the converter folds them into the weights,
conversion/falcon_h1.py ``modify_tensors``, so a wrong multiplier in impl fails against
llama.cpp too).

Each breaks impl's one body (impl/attention.py ``attn_block``, impl/recurrent.py
``recurrent_branch``) and is caught on falcon_h1's own case at the probe where it first
acts; the smoke matrix's falcon_h1 cases (numpy float32 paged against every reference,
torch float32, numpy float64, torch bfloat16) each kill it: every one is a gross break
(a whole branch, a multiplier of 0.5 or 0.4 taken as 1), far outside bfloat16's rounding.

Feature bisection names each decoration: ``branch_multipliers`` and ``mup_vector`` are
HF config fields (harness/families/_switches.py sets them to 1); ``parallel_ssm`` is a
weight switch that zeroes the branch's out_proj (harness/kinds/attention/switches.py), so
the sum adds nothing."""

from ...mutant import Mutant

FALCON_H1 = {"family": "falcon_h1", "schedule": "5,1,10"}

MUTANTS = [
    Mutant("parallel-ssm-reads-unnormed-row", "parallel_ssm", "impl.attention",
           "s_in = normed * cfg.ssm_in_multiplier if cfg.ssm_in_multiplier != 1.0 else normed",
           "s_in = x * cfg.ssm_in_multiplier if cfg.ssm_in_multiplier != 1.0 else x",
           FALCON_H1, "ssm_out",
           doc="the Mamba-2 branch reads the layer's input, not the normed row the attention reads (HF "
               "FalconH1DecoderLayer.forward: `hidden_states = self.input_layernorm(hidden_states)` feeds both "
               "`self.mamba(...)` and `self.self_attn(...)`; falcon-h1.cpp:156-160 build_mamba2_layer on `cur` "
               "after attn_norm; spec parallel_ssm_rows reads `normed`)"),
    Mutant("parallel-ssm-dropped", "parallel_ssm", "impl.attention",
           "        out = out + ssm\n", "        out = out\n",
           FALCON_H1, "resid_mid",
           doc="the Mamba-2 branch is computed (ssm_out passes) but never summed into the attention's output "
               "(HF FalconH1DecoderLayer.forward `hidden_states = mamba_hidden_states + attention_hidden_states`; "
               "falcon-h1.cpp `ggml_add(ctx0, attn_out, ssm_out)`; spec add_parallel_ssm)"),
    Mutant("key-multiplier-dropped", "branch_multipliers", "impl.attention",
           "k = k * cfg.key_multiplier", "k = k",
           FALCON_H1, "k",
           doc="K is not scaled by key_multiplier before RoPE (HF FalconH1Attention.forward `k_proj(hidden_states)"
               ".view(hidden_shape) * self.key_multiplier`; the converter folds it into attn_k): the tiny "
               "config's 0.5 taken as 1"),
    Mutant("mup-z-segment-dropped", "mup_vector", "impl.recurrent",
           "z = z * cfg.proj_multipliers[0]", "z = z",
           FALCON_H1, "ssm_out",
           doc="the gate z is not scaled by the mup vector's first segment (HF FalconH1Mixer `projected_states "
               "= self.in_proj(hidden_states) * self.mup_vector`, z | x | B | C | dt; the converter folds each "
               "segment into its rows of ssm_in): the tiny config's 0.4 taken as 1"),
]
