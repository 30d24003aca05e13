"""The GGUF file format: reading (the header, tensors, a file streamed layer by layer),
writing a family's export, and llama.cpp's weight types -- the floor under the families and
the references (import-linter: nothing here imports the pipeline)."""
