"""The GGUF file format: the header and tensors read without the ``gguf`` package's
overhead (fastread), the tensor helpers (tensors), llama.cpp's reading of the metadata
(meta, and the generated key table llamacpp_keys) -- the floor under the families and the
references: nothing here knows a family (import-linter's layers contract:
pipeline > families > gguf). Writing a family's export and reading a user's file back
into a family's model sit above the families, in harness/pipeline/gguf/."""
