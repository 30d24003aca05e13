"""The ``conformance`` command.

Exit status: 0 everything compared passed, 1 something failed (or nothing was
compared), 2 bad input -- one line on stderr naming what was wrong and what is
valid, no traceback, no report directory left behind.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import atexit
import os

from .errors import UsageError, suggest
from .case import Case
from . import references
from harness.checkpoint import family_of
from impl import Backend
from impl.config import ConfigError
from . import plugins, interrupt, runlog, cache


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        """One line, exit 2 (argparse would print the whole usage). ``main`` adds the
        "conformance: error:" prefix once; a subcommand's error names its --help."""
        m = re.search(r"argument (\S+): invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(3))
            what = "command" if m.group(1) == "cmd" else f"value for {m.group(1)}"
            message = f"unknown {what} {m.group(2)!r}; {suggest(m.group(2), choices)}"
        sub = self.prog.partition(" ")[2]
        raise UsageError(f"{message} (see conformance {sub + ' ' if sub else ''}--help)")


def parse_set(items: list[str] | None) -> tuple:
    out = []
    for item in items or []:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"malformed --set {item!r}: expected KEY=VALUE, e.g. --set num_key_value_heads=1")
        out.append((key.strip(), parse_value(raw)))
    return tuple(out)


def parse_value(raw: str):
    lit = {"true": True, "false": False, "null": None, "none": None}
    if raw.strip().lower() in lit:
        return lit[raw.strip().lower()]
    if raw.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        return float(raw)  # a number, so the config check can say it is not a finite one
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _add_case_args(p: argparse.ArgumentParser) -> None:
    # the valid values are `conformance list`'s: naming them here imported impl (numpy) into every
    # `conformance --help` (issue 29: --help <= 0.5 s); a bad value is refused naming them
    p.add_argument("--family", help="model family (see `conformance list`)")
    p.add_argument("--ref", default=None, help="hf, hf_cached (HF's own cache on the schedule), llamacpp, mlx (mlx-lm), "
                                                "several comma-separated (hf,mlx), or all -- every one of them, each "
                                                "also judged against the others (default hf; llamacpp with --gguf)")
    p.add_argument("--backend", default="numpy", help="array backend impl runs on (default numpy; see `conformance list`)")
    p.add_argument("--device", default="cpu", help="device of a torch backend (default cpu; see `conformance list`)")
    p.add_argument("--dtype", default="float32", help="compute dtype (default float32; see `conformance list`)")
    p.add_argument("--kv", default="decode", help="decode, batched or paged (default decode)")
    p.add_argument("--schedule", default="mixed",
                   help="prefill, decode, mixed (half in one call, then one row per call), or chunk sizes summing "
                        "to --tokens, e.g. 13,1,1,1 for the default 16 (default mixed)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override an HF config field (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the token ids (default 0)")
    p.add_argument("--tokens", type=int, default=16,
                   help="rows per sequence (default 16; at most the model's positions, e.g. max_position_embeddings)")
    p.add_argument("--seqs", type=int, default=None, help="sequences (default 1 for decode, 2 otherwise)")
    p.add_argument("--page-size", type=int, default=4, help="rows per page for --kv paged (default 4)")
    p.add_argument("--kv-evict", dest="kv_evict", action="store_true",
                   help="impl's contiguous KV (decode, batched) drops the rows a windowed layer can no longer read "
                        "(the spec's evict_layer_kv; off by default)")
    p.add_argument("--ragged", action="store_true",
                   help="--kv batched / paged: the sequences differ in length, first-call size and arrival "
                        "(sequence i joins the running batch at call i with a prefill of its own size, some leave "
                        "before others; continuous batching, drawn from the seed)")
    p.add_argument("--gguf-type", default="f32",
                   help="weight type of the GGUF the family's export is written as: f32, f16, bf16, or any "
                        "llama_model_quantize type (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_m, q4_k_m, q5_k_m, "
                        "q6_k, iq4_xs, iq4_nl ...; see harness/ggml_types.py); HF and impl then run on "
                        "the file's dequantized weights")
    p.add_argument("--hf-model", metavar="PATH", help="a local HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--gguf", metavar="PATH", help="a GGUF file: compare impl against llama.cpp on it")
    p.add_argument("--variant", help="a family's named variant (MLA families: absorbed, naive)")
    p.add_argument("--prompt", metavar="TEXT", help="token ids from this text, tokenized by llama.cpp with the "
                                                    "GGUF's own vocabulary (default: seeded random ids)")
    p.add_argument("--layers", metavar="I,J,...", help="capture and compare only these layers (0,5,-1; negative "
                   "from the end) -- HF, llama.cpp, impl and the float64 oracle alike")
    p.add_argument("--probes", metavar="P,Q,...", help="capture and compare only these probes (q_rope,attn_probs; "
                   "layer_in, attn_out and resid_mid always come too: a pass needs them)")
    p.add_argument("--weights", default="random", metavar="KIND",
                   help="the seeded model's weights: random (default: O(1) activations), realistic (a trained "
                        "model's statistics: outlier channels 20-100x in the embeddings and norms, Q/K so the "
                        "scores span tens) or trained (realistic, and recurrent decays -- A_log, dt_bias -- spread "
                        "as the references' initialisers spread them, so some channels remember for hundreds of "
                        "rows)")
    p.add_argument("--candidate", default="impl", metavar="NAME",
                   help="the engine judged (default impl; `conformance list` names the installed ones; dump:DIR)")
    p.add_argument("--policy", metavar="TOML", help="tolerance policy (default fixtures/tolerance.toml)")


def add_verbose(p) -> None:
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also show third-party warnings and logging on stderr (always in <run dir>/log.txt)")


def case_from_args(a):
    if not a.family and not a.gguf and not a.hf_model:
        raise UsageError("--family is required (or --hf-model PATH / --gguf PATH); see `conformance list`")
    family = a.family
    if a.hf_model and not family:
        family = family_of(a.hf_model)

    ref = a.ref if a.ref is not None else references.default(file=bool(a.gguf))
    return Case(family=family or "", ref=ref, backend=a.backend, device=a.device, dtype=a.dtype, kv=a.kv,
                schedule=a.schedule, seed=a.seed, tokens=a.tokens, seqs=a.seqs, overrides=parse_set(a.set),
                gguf_type=a.gguf_type, hf_model=a.hf_model, gguf=a.gguf, page_size=a.page_size,
                variant=a.variant, prompt=a.prompt, layers=a.layers,
                probes=a.probes, evict=a.kv_evict, candidate=a.candidate, weights=a.weights,
                ragged=a.ragged)


def _require_device(case) -> None:
    """One case asked for by hand on a device this machine lacks is bad input (a
    matrix that lists such cases records them as skipped instead)."""

    try:
        Backend(case.backend, case.device, case.dtype).check_available()
    except ConfigError as e:
        raise UsageError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    """Every command is a plug-in (entry point group ``attn_conformance.commands``, one
    module each under harness/commands: ``register(sub)`` adds its parser), in the
    order pyproject.toml declares them; a user's package adds its own the same way."""

    p = _Parser(prog="conformance", description="Differential conformance harness for attention implementations")
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    for name, ep in plugins.entry_points("commands", sort=False).items():
        try:
            mod = plugins.load("commands", name, ep)
        except plugins.PluginError as e:
            raise UsageError(str(e)) from None
        mod.register(sub)
    return p


def main(argv: list[str] | None = None, *, process: bool = False) -> int:
    """Run one command; its exit status. ``process``: main is the whole process (``entry``),
    so an interrupt may take over SIGINT for the way out; an in-process caller (a test, a
    user's script) keeps its own handler."""

    interrupt.install()
    try:
        parser = build_parser()
        a = parser.parse_args(argv)
        if not getattr(a, "fn", None):
            parser.print_help()
            return 2
        if getattr(a, "verbose", None) is not None:  # a command that writes a run directory

            runlog.setup(a.verbose)
        rc = int(a.fn(a) or 0)
        if getattr(a, "verbose", None) is not None:  # a command that used the cache: keep it under its limit

            try:
                cache.enforce_limit()
            except OSError:
                pass
        return rc
    except BrokenPipeError:  # the reader went away (| head): not an error of ours
        sys.stderr.close()
        return 0
    except (UsageError, plugins.PluginError) as e:  # a plug-in that does not load is bad input too
        print(f"conformance: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM where a command turns it into one
        # the interrupt is being handled: in a process of its own (entry), another SIGINT from
        # here on (a second Ctrl-C, one landing while the message is written or the pool's
        # threads are joined at exit) ends the process at once with the same status -- never
        # a KeyboardInterrupt escaping past this handler, which Python reports as death by
        # SIGINT (exit -2: CI, test_run[1.0])
        if process:
            interrupt.finish(130)
        interrupt.delivered()
        print(f"conformance: interrupted{'; ' + str(e) if str(e) else ''}", file=sys.stderr)
        return 130


def entry() -> None:
    """The console script and ``python -m harness``: ``main`` as a process. An interrupted
    command leaves by ``os._exit(130)`` once its exit hooks have run (the llama.cpp worker
    closed, temporary files gone): the interpreter's own teardown joins the pool threads a
    capture left running and, with a Ctrl-C of the whole group, ended the process by SIGINT
    instead (exit -2 after "conformance: interrupted" and main's 130: CI, test_run[1.0];
    tests/test_interrupt.py test_run_interrupted_twice)."""
    rc = main(process=True)
    if rc == 130:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(130)
    sys.exit(rc)


if __name__ == "__main__":
    entry()
