"""Where a family's probes live in HF: the decoder layers, the module points
forward hooks read, the eager attention function the capture wraps, and the
family's canonical layout of what HF hands back (harness/references/hf/capture.py drives
these hooks)."""

from __future__ import annotations

from dataclasses import dataclass
import contextlib

import numpy as np

from contract.layers import LayerConfig


@dataclass(frozen=True)
class Point:
    """Where a probe is read in HF: a module path relative to the decoder layer
    ('' is the layer itself) and whether its input or its output is taken."""

    path: str
    io: str  # "in" | "out"



class HFCapture:
    """The HF-capture half of ``Family`` (mixed in)."""
    layers_path = "model.layers"
    hf_points: dict[str, Point] = {}
    # model-level probes: name -> (module path from the model root, "in"/"out")
    hf_model_points = {"embeddings": ("model.embed_tokens", "out"), "final_norm": ("model.norm", "out")}
    # The eager attention function the attention module calls, by its name in the
    # module's own modeling file (wrapped during capture to read q_rope, k_rope,
    # attn_probs, attn_heads).
    eager_name = "eager_attention_forward"
    # probe -> why HF's tensor at that point is not the probe's quantity, so the capture
    # drops it and the report says not-exposed with this reason (granite_swa's eager
    # attention returns the softmax WITHOUT its sink: attn_probs is another quantity
    # there; default: none)
    hf_not_exposed: dict[str, str] = {}
    # probe -> how ``hf_taps`` computes it where HF names no tensor for it (gemma3n's
    # resid_mid: the decoder layer's own unnamed add, redone on the captured tensors); the
    # capture's meta says so and every row compared on it too (default: none)
    hf_tapped: dict[str, str] = {}

    def decoder_layers(self, model):
        """The decoder-layer MODULES, each once (a cycled model's physical layers)."""
        obj = model
        for part in self.layers_path.split("."):
            obj = getattr(obj, part)
        return list(obj)

    # ------------------------------------------------------------------ invocations
    def invocation_order(self, config) -> list[int] | None:
        """The module (an index into ``decoder_layers``) each LAYER of a forward runs,
        in the order the forward runs them -- one entry per invocation, the layer
        index of the probes, the cache and the layer descriptions. None (the
        default): each module once, in order (layer i = module i). A model that
        re-runs its layers (hrm_text: the L and H stacks, each invocation its own
        cache slot ``layer_idx + cycle_offset``) lists every invocation; the HF
        capture counts the calls of each module within a forward, so the n-th call
        of module m is the n-th layer whose entry is m (references/hf/capture.py)."""
        return None

    def layer_module(self, config, i: int) -> int:
        """The index into ``decoder_layers`` of the module layer ``i`` runs."""
        order = self.invocation_order(config)
        return i if order is None else order[i]

    def decoder_layer(self, model, config, i: int):
        """The module layer ``i`` runs (shared by every invocation of it)."""
        return self.decoder_layers(model)[self.layer_module(config, i)]

    def module_path(self, config, m: int) -> str:
        """The dotted path of decoder-layer module ``m`` from the model root."""
        return f"{self.layers_path}.{m}"

    def hf_refusal(self, config) -> str | None:
        """Why HF cannot compute ``config`` at all (hookspec.py), or None (default)."""
        return None

    def hf_cached_schedule_refusal(self, config, chunks: tuple[int, ...]) -> str | None:
        """Why HF's cached path cannot run ``config`` on calls of ``chunks`` rows
        (hookspec.py), or None (default)."""
        return None

    def hf_force(self, layer, forced):
        """Teacher-force decoder-layer module ``layer``: ``forced()`` gives the running
        layer's ``layer_in`` (a torch tensor in the compute dtype) or None (its own
        input). Default: a forward pre-hook, prepended, replacing the layer's
        ``hidden_states`` (the ``layer_in`` probe hook then records the forced input).
        A family whose ``layer_in`` is not the layer's input overrides (gemma3n: the
        active AltUp prediction). Returns a handle with ``remove()``."""
        def pre(mod, args, kwargs):
            t = forced()
            if t is None:
                return None
            if args:
                return (t, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": t}

        return layer.register_forward_pre_hook(pre, with_kwargs=True, prepend=True)

    # ------------------------------------------------------------------ probes
    def hf_points_for(self, config, i: int) -> dict[str, Point]:
        """The probe points of layer ``i`` (families with mixed layer kinds override)."""
        return self.hf_points

    def hf_taps(self, model, config, sink: dict):
        """A context manager held around the HF forward that records probes neither
        a module hook nor the eager-function wrapper can read -- for models whose
        attention math is inline (bloom, mpt: no ``eager_attention_forward``).
        It writes ``sink[layer_idx][probe] = float64 array``, as the eager wrapper
        does (``hf_canonical`` then applies). Default: nothing."""

        return contextlib.nullcontext()

    def hf_derived(self, probes: dict, config, layer_cfgs) -> dict:
        """Probes HF exposes only as views of other captured (canonical) tensors,
        ``{"L{i}.{probe}": array}`` (default: none; MLA families slice the rope
        part out of the query and key the eager attention reads)."""
        return {}

    def hf_products(self, lc: LayerConfig) -> dict[str, float]:
        """The factor HF's next line multiplies a probe's module output by, where no module
        returns the product (falcon_h1's muP multipliers): ``{probe: factor}``. Default: none."""
        return {}

    def hf_probe(self, probe: str, arr: np.ndarray, lc: LayerConfig, own: frozenset = frozenset()) -> np.ndarray:
        """A captured module output as the probe's value: the canonical layout
        (``hf_canonical``), times the factor HF's next line applies (``hf_products``) --
        except for the probes in ``own``, where the reference's module output already is its
        own value (mlx-lm folds some multipliers into weights, and never applies others:
        harness/references/mlx/families.py ``OWN_VALUE``)."""
        arr = self.hf_canonical(probe, arr, lc)
        f = None if probe in own else self.hf_products(lc).get(probe)
        return arr if f is None or f == 1.0 else arr * f

    def hf_canonical(self, probe: str, arr: np.ndarray, lc: LayerConfig) -> np.ndarray:
        """HF's tensor for ``probe`` ([seqs, ...]) in the canonical layout."""
        if not isinstance(lc, LayerConfig) or lc.shape != "gqa":
            return arr
        s, t = arr.shape[0], arr.shape[1] if arr.ndim > 1 else None
        if probe == "q":
            return arr.reshape(s, t, lc.n_heads, lc.head_dim)
        if probe == "k":
            return arr.reshape(s, t, lc.n_kv_heads, lc.head_dim)
        if probe == "v":
            return arr.reshape(s, t, lc.n_kv_heads, lc.dv)
        if probe in ("q_rope", "k_rope"):  # eager: [S, heads, T, D]
            return arr.transpose(0, 2, 1, 3)
        return arr
