"""Convert HF checkpoints to GGUF with llama.cpp's OWN converter (run in a subprocess
by tests/test_real_models.py): a GGUF this project did not write.

    python convert_with_llamacpp.py LLAMA_CPP_TREE JOBS_JSON

LLAMA_CPP_TREE holds convert_hf_to_gguf.py, conversion/ and gguf-py/ (the
converter puts gguf-py on its own path). JOBS_JSON: [[checkpoint_dir,
out_file, outtype], ...]. sentencepiece must be importable (PYTHONPATH).

The converter needs a tokenizer next to the weights: llama, qwen2 and qwen3
all try ``_set_vocab_sentencepiece`` first (conversion/llama.py
``LlamaModel.set_vocab``, conversion/qwen.py ``Qwen2Model.set_vocab``), so a
tiny SentencePiece model (``tokenizer.model``) trained here on a few words is
what each checkpoint gets; the converter pads the vocabulary to the config's
vocab_size with [PAD] tokens. The converter runs through its own command line
(``main()`` with argv), once per job, in this one process.
"""

import io
import json
import runpy
import sys
from pathlib import Path


def tiny_tokenizer(dest: Path) -> None:
    import sentencepiece as spm

    text = [f"the quick brown fox jumps over the lazy dog {i}" for i in range(64)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text), model_writer=buf, vocab_size=60, model_type="bpe",
                                   hard_vocab_limit=False, minloglevel=2)
    dest.write_bytes(buf.getvalue())


def main() -> int:
    tree, jobs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    script = tree / "convert_hf_to_gguf.py"
    sys.path.insert(0, str(tree))  # the converter's `conversion` package
    for ckpt, out, outtype in jobs:
        tok = Path(ckpt) / "tokenizer.model"
        if not tok.exists():
            tiny_tokenizer(tok)
        sys.argv = [str(script), ckpt, "--outfile", out, "--outtype", outtype]
        runpy.run_path(str(script), run_name="__main__")
        if not Path(out).is_file():
            print(f"converter wrote no {out}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
