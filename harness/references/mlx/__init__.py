"""mlx-lm as a reference (``--ref mlx``): a third implementation nobody here wrote.

When HF and llama.cpp disagree, a third witness says whom the rest of the
ecosystem follows. mlx-lm reads the same checkpoint the HF reference builds and
runs it through its own caches on the case's schedule (capture.py). It is not
an oracle (the float64 oracle stays HF's), computes its own model
(``model_of = None``: a finding about HF does not excuse it), and is installed by
the extra ``mlx`` (``mlx[cpu]`` on Linux, ``mlx`` on macOS). A family mlx-lm
does not implement is ``not-implemented`` for it, with the reason.
"""

from __future__ import annotations

from pathlib import Path
import importlib
import importlib.util
from importlib.metadata import PackageNotFoundError, version
import tempfile
from importlib.util import find_spec
import contextlib
import io

from .. import Reference
from ..capture import RefCapture
from harness.lazy import lazy
from ...versions import read_lock
from .checkpoint import rewrite
from .checkpoint import model_type as layout_type
from .checkpoint import bridged, config_for, layer_pattern_refusal, missing_fields
from .families import CONFIG_REFUSALS, UNSUPPORTED
from ...errors import UsageError
from ...schedule import chunk_sizes
from ... import cache
from ...versions import versions
from . import capture as mlxcap
from .. import NotImplementedHere

mx = lazy("mlx.core")
mlx_lm_utils = lazy("mlx_lm.utils")
hf_logging = lazy("transformers.utils.logging")
utils = lazy("mlx_lm.utils")

CAPTURE_SCHEMA = 1


class Mlx(Reference):
    label = "mlx-lm (MLX, CPU)"
    requires = "mlx"
    cached = True  # it runs the case's schedule through its own caches
    forced_oracle = True  # HF's model from HF's checkpoint: HF's float64 on its layer inputs is its twin
    # in --ref all: every family it implements has a verdict against it (a pass, a finding with
    # its lines, or a refusal with the reason: families.py), and where it follows one side of an
    # HF-vs-llama.cpp finding the case measures so itself (Judge.witnesses). The inherited
    # in_all = True; the tests written about HF and llama.cpp name those references
    # (harness.testing.HF_AND_LLAMACPP), so a witness joining `all` changes none of them

    def available(self) -> bool:
        return find_spec("mlx_lm") is not None and find_spec("mlx") is not None

    def model_type(self, config, family=None) -> str | None:
        """The mlx-lm module that implements ``config``'s model type (or the one the
        family's checkpoint is rewritten to: checkpoint.LAYOUTS), or None."""
        mt = (family is not None and layout_type(family.name)) or getattr(config, "model_type", None)
        mt = getattr(utils, "MODEL_REMAPPING", {}).get(mt, mt)
        if importlib.util.find_spec(f"mlx_lm.models.{mt}") is None:
            return None
        return mt

    def module_refusal(self, mt: str) -> str | None:
        """Why mlx-lm's module for ``mt`` cannot be imported here, or None: mlx_lm/models/olmo.py
        prints a line and calls sys.exit(1) without the ``ai2-olmo`` package."""
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                importlib.import_module(f"mlx_lm.models.{mt}")
        except (ImportError, SystemExit) as e:
            said = " ".join(out.getvalue().split()) or f"{type(e).__name__}: {e}"
            return f"mlx_lm/models/{mt}.py does not import here ({said})"
        return None

    def refusal(self, family, config) -> str | None:
        """Why mlx-lm cannot run ``family`` on ``config`` (not-implemented), or None."""
        if not self.available():
            return "mlx-lm is not installed (pip install -e '.[mlx]')"
        mt = self.model_type(config, family)
        if mt is None:
            return (f"mlx-lm {_version()} implements no model type {getattr(config, 'model_type', '?')!r} "
                    "(mlx_lm/models/)")
        why = self.module_refusal(mt)
        if why:
            return f"mlx-lm {_version()}: {why}"

        written = config_for(family.name, config.to_dict())
        why = layer_pattern_refusal(written, mt)
        if why:
            return f"mlx-lm {_version()}: {why}"
        test, why = CONFIG_REFUSALS.get(mt, (None, None))
        if test is not None and test(bridged(written)):
            return f"mlx-lm {_version()}: {why}"
        lost = missing_fields(written, mt)
        if lost:
            return (f"mlx-lm {_version()}'s {mt}.ModelArgs requires {', '.join(lost)}, which "
                    f"{type(config).__name__} (transformers' port) does not write; the hub's checkpoints of the "
                    "original model carry them (mlx_lm/models/" + mt + ".py)")
        rp = getattr(config, "rope_parameters", None) or {}
        if any(isinstance(v, dict) and "freq_factors" in v for v in (rp, *rp.values())):
            # a GGUF file's rope_freqs tensor (--gguf, where no HF RoPE type computes it): the HF
            # reference divides it into its own RoPE table (references/hf/rope.py); no config key
            # carries it, so the checkpoint mlx-lm reads cannot
            return (f"mlx-lm {_version()}: this file's rope_freqs (freq_factors) reach HF's model only through "
                    "the HF reference's RoPE table (references/hf/rope.py); no config key mlx-lm reads holds them")
        why = UNSUPPORTED.get(family.name)
        return None if why is None else f"mlx-lm {_version()}: {why}"

    # what the adapter reads of mlx-lm (module, name): checked at start-up (preflight), so a
    # release that moved one is refused in one line, not a KeyError in the middle of a matrix
    READS = (("mlx_lm.utils", "load_model"), ("mlx_lm.models.cache", "make_prompt_cache"),
             ("mlx_lm.models.base", "scaled_dot_product_attention"))

    def preflight(self, family, config) -> None:
        if not self.available() or self.refusal(family, config) is not None:
            return  # nothing of it runs: the refusal says why, as a row or in one line
        mt = self.model_type(config, family)
        lost = [f"{m}.{n}" for m, n in (*self.READS, (f"mlx_lm.models.{mt}", "Model"),
                                        (f"mlx_lm.models.{mt}", "ModelArgs"))
                if not hasattr(importlib.import_module(m), n)]
        if lost:
            raise UsageError(f"mlx-lm {_version()} lacks {', '.join(lost)}, which the mlx reference reads "
                             f"(harness/references/mlx/); the lock's is {_locked()}")

    def calls(self, req) -> list[int]:
        return chunk_sizes(req.case.schedule, int(req.tokens.shape[1]))

    def compute_dtype(self, case_dtype: str) -> str:
        """float32, bfloat16 and float16 as asked. float64: MLX 0.32.4's CPU takes the dtype, but
        its fused kernels compute it at float32's precision (llama, torch float64: impl vs mlx at
        L0 attn_in, after its fast rms_norm, NMSE 4.7e-15 against a float64 bound of 1e-20), so
        this reference computes -- and is judged at -- float32 there, as llama.cpp is."""
        return "float32" if case_dtype == "float64" else case_dtype

    def capture(self, req, **kw) -> RefCapture:
        dtype = self.compute_dtype(req.case.dtype)
        why = self.refusal(req.family, req.config)
        if why is not None:
            raise NotImplementedError(why)
        sel = req.selection
        src = cache.source_hash(*cache.family_sources(req.family), *sorted(Path(__file__).parent.glob("*.py")),
                                *req.family_base_sources)
        calls = self.calls(req)
        k = cache.key("mlx", CAPTURE_SCHEMA, req.family.name, req.config.to_json_string(use_diff=False),
                      req.case.seed, req.tokens.tolist(), dtype, calls, _version(), _version("mlx"),
                      versions().get("transformers"), src, *req.weights_stamp,
                      *((["weights", req.case.weights],) if req.case.weights != "random" else ()),
                      *((["selection", sel.label()],) if sel.label() else ()))
        hit = cache.load("mlx", k)
        if hit is not None:
            return RefCapture(self.name, dtype, hit[0], meta=hit[1], cached=True, key=k)
        model, hf_embed = _load(req, dtype)
        meta = {"family": req.family.name, "dtype": dtype, "calls": len(calls), "mlx_lm": _version()}
        if "Scaled" in hf_embed:
            # HF scales the embedding inside its module (Gemma's *ScaledWordEmbedding); mlx-lm's models
            # multiply after their nn.Embedding (mlx_lm/models/gemma2.py Gemma2Model: h * hidden_size**0.5):
            # the module's output is another point, and the scaled one is never an array of its own
            meta["not_exposed"] = {"embeddings": f"mlx-lm scales the embedding after its nn.Embedding; HF inside "
                                                 f"{hf_embed} (mlx_lm/models/{self.model_type(req.config, req.family)}.py)"}
        want_layer = (lambda i: True) if sel.layers is None else (lambda i: i in set(sel.layers))
        want_probe = (lambda p: True) if sel.probes is None else (lambda p: p in set(sel.probes))
        try:
            probes = mlxcap.capture(req.family, model, req.config, list(req.layer_cfgs), req.tokens, calls,
                                    want_layer, want_probe, meta)
        except RuntimeError as e:
            said = " ".join(str(e).split())
            if "only supports float32" in said:
                # MLX's CPU kernels of some operations take float32 alone (GatherMM, the
                # experts' gathered matmul of mlx_lm/models/switch_layers.py): this model, in
                # this dtype, is one mlx-lm does not compute here

                raise NotImplementedHere(f"MLX {_version('mlx')}'s CPU computes an operation of this model in "
                                         f"float32 only, not {dtype} ({said[:200]})") from None
            raise
        st = cache.store("mlx", k, probes, meta)
        return RefCapture(self.name, dtype, st, meta=meta, key=k)


def _locked() -> str:
    return read_lock().get("mlx-lm") or "not pinned"


def _version(dist: str = "mlx-lm") -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _load(req, dtype: str):
    """mlx-lm's model of the case: the HF model's checkpoint, saved as a user's download
    is (config.json + safetensors), read by ``mlx_lm.utils.load_model``, cast to ``dtype``;
    and the class of HF's embedding module."""

    hf_model, _ = req.model("float32")
    with tempfile.TemporaryDirectory(prefix="conformance-mlx-") as d:
        was = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # "Writing model shards" on every capture's stderr
        try:
            hf_model.save_pretrained(d, safe_serialization=True)
        finally:
            if was:
                hf_logging.enable_progress_bar()
        rewrite(req.family.name, Path(d))
        try:
            model, _config = mlx_lm_utils.load_model(Path(d), lazy=False)
        except ValueError as e:
            # mlx_lm.utils.load_model -> nn.Module.load_weights(strict=True): the checkpoint holds
            # weights its module has no place for, or lacks ones it needs -- mlx-lm's model of this
            # family does not implement what the config asks (gemma2's attention_bias=True)
            said = " ".join(str(e).split())
            # (or holds them in other shapes: mlx_lm/models/mixtral.py and internlm3.py size the heads
            # hidden_size // num_attention_heads whatever head_dim says -- "Expected shape ...")
            if "parameters not in model" in said or "Missing" in said or "Expected shape" in said:

                mt = Mlx().model_type(req.config, req.family) or getattr(req.config, "model_type", "?")
                raise NotImplementedHere(f"mlx-lm {_version()} cannot build this config's model "
                                         f"(mlx_lm/models/{mt}.py, load_weights): {said[:300]}") from None
            raise
    model.set_dtype(getattr(mx, dtype))
    model.eval() if hasattr(model, "eval") else None
    return model, type(hf_model.get_input_embeddings()).__name__
