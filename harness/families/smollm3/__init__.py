"""smollm3: a llama-shaped decoder whose every fourth layer is NoPE (HF
``SmolLM3ForCausalLM``; llama.cpp ``src/models/smollm3.cpp``).

HF (``modeling_smollm3.py``): ``SmolLM3Attention.__init__`` reads
``use_rope = config.no_rope_layers[layer_idx]`` and ``forward`` rotates Q/K
only ``if self.use_rope``; ``SmolLM3Config.__post_init__`` derives
``no_rope_layers[i] = int((i + 1) % no_rope_layer_interval != 0)`` (1 = RoPE).
With ``use_sliding_window`` the NoPE layers become sliding layers
(``layer_types``).

llama.cpp: ``load_arch_hparams`` hard-codes ``n_no_rope_layer_step = 4`` (no
GGUF key) and the graph rotates iff ``(il + 1) % 4 != 0``; it has no sliding
window at all (``build_attn_inp_kv``). The converter (``conversion/llama.py``
``SmolLM3Model(LlamaModel)``) inherits llama's Q/K row permutation (the graph
runs ``LLAMA_ROPE_TYPE_NORM``).

Configs:
- default (below): 4 layers, ``no_rope_layer_interval=4`` -> layer 3 is NoPE
  in both references.
- HF-only ``--set no_rope_layer_interval=2`` (layers 1 and 3 NoPE in HF;
  llama.cpp still NoPE only at layer 3): impl is judged against HF; llama.cpp's
  layer 1 is a ``[[finding]]`` (fixtures/tolerance.toml).
- HF-only ``--set use_sliding_window=true --set sliding_window=4`` (HF's NoPE
  layer 3 becomes sliding; llama.cpp's smollm3 graph has no window): a
  ``[[finding]]`` too.
"""

from __future__ import annotations

from ..base import lc_unrotated
from ..llama import Llama


class SmolLM3(Llama):
    name = "smollm3"
    # NoPE layer patterns: llama.cpp's smollm3 / llama4 fix the step at 4 (n_no_rope_layer_step, no
    # GGUF key), so another interval is HF-only
    # the fuzzer's knobs (harness/fuzz.py; hf_only: a knob only HF expresses, judged against HF alone)
    fuzz_space = {"knobs": ("heads", "theta", "nope_interval"), "hf_only": ("nope_interval",)}
    hf_model_type = "smollm3"
    description = "NoPE every no_rope_layer_interval-th layer (llama.cpp: fixed at 4), llama permute"
    tiny = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        no_rope_layer_interval=4, tie_word_embeddings=False,
        # the HF default pad id 128004 is outside a 128-token vocabulary
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    gguf_arch = "smollm3"
    extra_settable = ()  # head_dim is hidden // heads in SmolLM3Attention (config.head_dim unused)

    # head_dim: SmolLM3Attention.__init__: getattr(config, "head_dim", hidden // heads), LlamaLike's

    def finding_values(self, config) -> dict:
        """Whether HF's NoPE layers are not llama.cpp's fixed ones (every 4th: smollm3.cpp
        n_no_rope_layer_step = 4, no GGUF key), whichever key said them -- the list
        no_rope_layers real checkpoints carry, or no_rope_layer_interval (issue 39: the
        finding's condition named the interval alone, and a list reached no excuse)."""
        n = int(config.num_hidden_layers)
        return {"nope_pattern_differs": [int(x) for x in config.no_rope_layers] != [int((i + 1) % 4 != 0)
                                                                                    for i in range(n)]}

    def uses_rope(self, config, i: int) -> bool:
        # SmolLM3Attention.use_rope = config.no_rope_layers[layer_idx] (1 = rotate)
        return bool(config.no_rope_layers[i])

    def feature_switches(self, config, features):
        sw = super().feature_switches(config, features)
        if "nope_layers" in features:  # every layer rotates (no_rope_layers: 1 = RoPE)
            sw["nope_layers"] = {"no_rope_layers": [1] * config.num_hidden_layers}
        return sw

    def lc_points_for(self, config, i: int):
        # smollm3.cpp: use_rope = (il + 1) % 4 != 0. Where llama.cpp does not rotate,
        # there is no ROPE node: the tensor entering attention is the reshaped Qcur/Kcur.
        if (i + 1) % 4 != 0:
            return self.lc_points
        return lc_unrotated(self.lc_points)


FAMILY = SmolLM3()
