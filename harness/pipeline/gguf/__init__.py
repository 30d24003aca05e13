"""GGUF files as the pipeline meets them: a family's model written to a file (export,
the converter's steps), a user's file read back into a family's HF model (reader: the
family picked from ``general.architecture``, its config from the metadata, its weights
through the export run backwards; stream: layer by layer), and the weights a case takes
from either (weights). Above the families; the format itself is harness/gguf/."""
