"""A stand-in for the llama.cpp worker that dies the way a crashing llama.cpp does."""

import ctypes
import os
import signal
import sys

if __name__ == "__main__":
    print("GGML_ASSERT(n_tokens > 0) failed", file=sys.stderr, flush=True)
    if os.environ.get("CRASH_KIND") == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    ctypes.string_at(0)  # SIGSEGV
