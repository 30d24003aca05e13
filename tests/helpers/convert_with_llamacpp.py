"""Convert HF checkpoints to GGUF with llama.cpp's OWN converter (run in a subprocess
by the tests): a GGUF this project did not write.

    python convert_with_llamacpp.py LLAMA_CPP_TREE JOBS_JSON

LLAMA_CPP_TREE holds convert_hf_to_gguf.py, conversion/ and gguf-py/ (the
converter puts gguf-py on its own path). JOBS_JSON: [[checkpoint_dir,
out_file, outtype, vocab, extra_args], ...]; ``vocab`` (optional):

- ``"sentencepiece"`` (default): the converter's own ``set_vocab`` on a tiny
  SentencePiece model (``tokenizer.model``) trained here on a few words --
  llama, qwen2 and qwen3 all try ``_set_vocab_sentencepiece`` first
  (conversion/llama.py ``LlamaModel.set_vocab``, conversion/qwen.py
  ``Qwen2Model.set_vocab``); the converter pads the vocabulary to the
  config's vocab_size with [PAD] tokens. sentencepiece must be importable.
- ``"tiny"``: the model class's ``set_vocab`` is replaced by a writer of a
  tiny SentencePiece-style vocabulary (unk, bos, eos, the 256 byte tokens,
  plain pieces): most converter classes want a real tokenizer whose
  pre-tokenizer hash they recognise (``get_vocab_base_pre``), which no tiny
  checkpoint has. Only ``tokenizer.*`` keys change: every hyper-parameter
  and tensor is the converter's own.

``extra_args`` (optional): more converter options (``--no-mtp`` for the
qwen3-next family, whose checkpoints here have no MTP layers). ``patch``
(optional, a sixth element): ``{"config": {...}, "hub_keys": bool}`` -- keys
written into config.json first (the ``architectures`` a hub checkpoint names
where transformers 5 saves another: EXAONE's ``ExaoneForCausalLM``, Mistral 3's
``Mistral3ForConditionalGeneration``), and whether HUB_KEYS are added (default
true; false shows the converter refusing a transformers 5 config).

``architectures`` the converter registers under another spelling than
transformers saves (conversion/mpt.py: ``MPTForCausalLM``) are renamed in
config.json first, and hub-config keys transformers 5 no longer saves are
added (HUB_KEYS). The converter runs through its own command line
(``main()`` with argv), once per job, in this one process.
"""

import io
import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the project: harness.pipeline.gguf.export
from harness.pipeline.gguf.export import write_tiny_vocab  # noqa: E402

# transformers' saved architecture -> the name the converter registers
# (conversion/phi.py registers "PhiMoEForCausalLM"; transformers 5 saves PhimoeForCausalLM)
ARCH_ALIASES = {"MptForCausalLM": "MPTForCausalLM", "PhimoeForCausalLM": "PhiMoEForCausalLM"}

# config keys the converter reads unconditionally from hub configs that
# transformers 5 no longer saves, with the value transformers' model implies:
# conversion/command_r.py Cohere2Model reads rotary_pct; transformers'
# Cohere2RotaryEmbedding rotates the whole head_dim (modeling_cohere2.py)
HUB_KEYS = {"Cohere2ForCausalLM": {"rotary_pct": 1.0},
            # conversion/exaone.py ExaoneModel.set_gguf_parameters asserts
            # hparams["activation_function"] == "silu": the hub's remote-code config key, which
            # transformers 5's ExaoneConfig maps onto hidden_act (attribute_map) and saves as that
            "ExaoneForCausalLM": {"activation_function": "silu"},
            # conversion/gpt_neox.py reads hparams["rotary_pct"], which transformers 5's
            # GPTNeoXConfig turns into rope_parameters' partial_rotary_factor (the gpt_neox
            # family's tiny: 0.25)
            "GPTNeoXForCausalLM": {"rotary_pct": 0.25}}


def tiny_tokenizer(dest: Path) -> None:
    import sentencepiece as spm

    text = [f"the quick brown fox jumps over the lazy dog {i}" for i in range(64)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=60, model_type="bpe",
                                   hard_vocab_limit=False, minloglevel=2)
    dest.write_bytes(buf.getvalue())


def tiny_set_vocab(self) -> None:
    """A vocabulary llama.cpp's SPM tokenizer loads, as big as the config's."""
    n = int(self.hparams.get("vocab_size") or self.hparams["text_config"]["vocab_size"])
    write_tiny_vocab(self.gguf_writer, n)  # the harness export's own tiny vocabulary


def main() -> int:
    tree, jobs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    script = tree / "convert_hf_to_gguf.py"
    sys.path.insert(0, str(tree))  # the converter's `conversion` package
    sys.path.insert(1, str(tree / "gguf-py"))
    import conversion

    get_model_class = conversion.get_model_class
    state = {"tiny": False}
    patched_classes = {}  # class -> its own set_vocab (None: inherited)

    def patched(name, mmproj=False):
        cls = get_model_class(name, mmproj)
        if state["tiny"]:
            # and the model classes it nests and delegates to (conversion/mistral3.py: the
            # Ministral 3 wrapper's self.impl = Mistral3Model.Ministral3Model(...), whose own
            # set_vocab the wrapper calls)
            from conversion.base import ModelBase

            inner = [c for c in vars(cls).values() if isinstance(c, type) and issubclass(c, ModelBase)]
            for c in (cls, *inner):
                patched_classes.setdefault(c, c.__dict__.get("set_vocab"))
                c.set_vocab = tiny_set_vocab
        return cls

    conversion.get_model_class = patched
    # the converter reads config.json through transformers (conversion/base.py
    # ModelBase.load_hparams: AutoConfig.from_pretrained(...).to_dict()), which drops a
    # key that is an alias of another (ExaoneConfig.attribute_map: activation_function ->
    # hidden_act) even when config.json has it: the job's hub keys are added to what it
    # returns, as a transformers without the model type (config.json read as it is) gave
    from conversion.base import ModelBase

    load_hparams = ModelBase.load_hparams

    def with_hub_keys(dir_model, is_mistral_format):
        config = load_hparams(dir_model, is_mistral_format)
        for k, v in state.get("hub", {}).items():
            config.setdefault(k, v)
        return config

    ModelBase.load_hparams = staticmethod(with_hub_keys)
    for job in jobs:
        ckpt, out, outtype = job[:3]
        vocab = job[3] if len(job) > 3 else "sentencepiece"
        extra = list(job[4]) if len(job) > 4 else []
        patch = job[5] if len(job) > 5 else {}
        cfg_path = Path(ckpt) / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg.update(patch.get("config", {}))
        archs = [ARCH_ALIASES.get(a, a) for a in cfg.get("architectures") or []]
        state["hub"] = {k: v for a in archs for k, v in HUB_KEYS.get(a, {}).items()} \
            if patch.get("hub_keys", True) else {}
        hub = {k: v for k, v in state["hub"].items() if k not in cfg}
        if archs != cfg.get("architectures") or hub or patch.get("config"):
            cfg["architectures"] = archs
            cfg.update(hub)
            cfg_path.write_text(json.dumps(cfg, indent=2))
        for cls, own in patched_classes.items():  # every job starts from the converter's own classes
            if own is None:
                del cls.set_vocab
            else:
                cls.set_vocab = own
        patched_classes.clear()
        state["tiny"] = vocab == "tiny"
        tok = Path(ckpt) / "tokenizer.model"
        if vocab == "sentencepiece" and not tok.exists():
            tiny_tokenizer(tok)
        sys.argv = [str(script), ckpt, "--outfile", out, "--outtype", outtype, *extra]
        runpy.run_path(str(script), run_name="__main__")
        if not Path(out).is_file():
            print(f"converter wrote no {out}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
