"""scripts/family_survey.py on a made-up llama.cpp tree: the converter's registration, the
arch it writes (its own or its base's), the graph by file or by the model factory's name,
transformers' model type for the class (case aside), and the family here."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import family_survey  # noqa: E402


def _tree(tmp_path: Path) -> Path:
    t = tmp_path / "llama.cpp"
    (t / "conversion").mkdir(parents=True)
    (t / "gguf-py" / "gguf").mkdir(parents=True)
    (t / "src" / "models").mkdir(parents=True)
    (t / "conversion" / "__init__.py").write_text(
        'TEXT_MODEL_MAP: dict[str, str] = {\n    "LlamaForCausalLM": "llama",\n    "MPTForCausalLM": "mpt",\n'
        '    "GptOssForCausalLM": "gpt_oss",\n    "NoSuchForCausalLM": "llama",\n}\n')
    (t / "conversion" / "llama.py").write_text(
        "class TextModel:\n    pass\n\n\n@ModelBase.register('LlamaForCausalLM', 'NoSuchForCausalLM')\n"
        "class LlamaModel(TextModel):\n    model_arch = gguf.MODEL_ARCH.LLAMA\n")
    (t / "conversion" / "mpt.py").write_text(
        "class Base:\n    model_arch = gguf.MODEL_ARCH.MPT\n\n\n@ModelBase.register('MPTForCausalLM')\n"
        "class MPTModel(Base):\n    pass\n")
    (t / "conversion" / "gpt_oss.py").write_text(
        "@ModelBase.register('GptOssForCausalLM')\nclass GptOss:\n    model_arch = gguf.MODEL_ARCH.GPT_OSS\n")
    (t / "gguf-py" / "gguf" / "constants.py").write_text(
        'MODEL_ARCH_NAMES: dict = {\n    MODEL_ARCH.LLAMA: "llama",\n    MODEL_ARCH.MPT: "mpt",\n'
        '    MODEL_ARCH.GPT_OSS: "gpt-oss",\n}\n')
    (t / "src" / "llama-arch.cpp").write_text('{ LLM_ARCH_OPENAI_MOE, "gpt-oss" },\n{ LLM_ARCH_LLAMA, "llama" },\n')
    (t / "src" / "llama-model.cpp").write_text("case LLM_ARCH_OPENAI_MOE:\n    return new llama_model_openai_moe(params);\n")
    for f in ("llama.cpp", "openai-moe.cpp"):  # no mpt graph
        (t / "src" / "models" / f).write_text("")
    return t


def test_the_survey_reads_both_references_sources(tmp_path):
    rows = {r["hf_arch"]: r for r in family_survey.survey(_tree(tmp_path))}
    llama = rows["LlamaForCausalLM"]
    assert llama["arch"] == "llama" and llama["graph"] and "llama" in llama["model_type"].split(", ")
    assert "llama" in llama["families"]
    assert rows["MPTForCausalLM"]["arch"] == "mpt"  # the base's model_arch
    assert not rows["MPTForCausalLM"]["graph"]  # no src/models file for it
    assert rows["MPTForCausalLM"]["model_type"] == "mpt"  # transformers spells it MptForCausalLM
    oss = rows["GptOssForCausalLM"]
    assert oss["arch"] == "gpt-oss" and oss["graph"] and "gpt_oss" in oss["families"]  # via the factory's name
    assert rows["NoSuchForCausalLM"]["model_type"] == "" and not rows["NoSuchForCausalLM"]["families"]


def test_a_tree_without_the_converter_is_one_line_exit_2(tmp_path, capsys):
    assert family_survey.main([str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
