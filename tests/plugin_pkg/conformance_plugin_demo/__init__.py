"""A reference and a family that live outside the harness: the proof that each
plug-in point is one folder and one entry point (tests/test_contract.py)."""

from harness.families.llama import Llama
from harness.references.hf import HF


class HFTwin(HF):
    """HF transformers again, under another name: a third reference."""

    label = "HF transformers (a plug-in twin)"


class LlamaTwin(Llama):
    name = "llama_twin"
    description = "llama, registered by a package of its own"


FAMILY = LlamaTwin()
