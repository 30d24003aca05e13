"""The environment of every llama.cpp subprocess (the reference's capture worker,
its tokenizer, the GGUF quantizer in gguf/weights.py). Its own module: the GGUF
package sits below the references in the import layers, and both start such
processes."""

from __future__ import annotations

import os

from harness.versions import ROOT


def worker_env() -> dict:
    """This checkout importable, and no backtrace on abort -- ggml_abort's
    ggml_print_backtrace (ggml/src/ggml.c) attaches gdb to the aborting process
    where gdb is installed, which under load held an aborting worker past its
    timeout (an error reading "timed out after 302 s" instead of the abort's
    signal 6 and its GGML_ASSERT line)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["GGML_NO_BACKTRACE"] = "1"
    return env
