"""Switches of the seeded model (feature bisection, harness/bisect.py): one feature
turned off in the model every side takes its weights from, where no config field
reaches. The machinery; each layer kind's own switches are in its folder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.lazy import lazy

torch = lazy("torch")
modeling_llama = lazy("transformers.models.llama.modeling_llama")


@dataclass(frozen=True)
class ModelSwitch:
    """One feature switched off in the seeded model (see ``Family.model_switches``).

    ``edit(model, config, layer_cfgs)`` changes the model in place and returns how
    many tensors or modules it changed (0: the feature is not there to switch);
    ``layer(lc)`` tells impl the same (a module switch), None for a weight switch,
    which neutralises weights impl reads from the model anyway."""

    what: str
    edit: Any
    layer: Any = None
    hf_only: bool = False


def _fill_params(family, model, endings: tuple[str, ...], value: float) -> int:
    n = 0
    with torch.no_grad():
        for layer in family.decoder_layers(model):
            for name, p in layer.named_parameters():
                if name.endswith(endings):
                    p.fill_(value)
                    n += 1
    return n


def _plain_rms(module):
    """A ``(1 + w)`` RMS norm module as HF ``LlamaRMSNorm`` with weight ``1 + w``."""
    w = module.weight.detach()
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", 1e-6))
    new = modeling_llama.LlamaRMSNorm(w.shape[-1], eps=eps).to(w.dtype)
    with torch.no_grad():
        new.weight.copy_(1.0 + w)
    return new


def _open_gate(module):
    """A gate projection replaced by a constant 1e4: ``sigmoid(1e4) == 1`` exactly in
    every float type, so the gate it feeds passes the branch through unchanged."""

    class OpenGate(torch.nn.Module):
        def __init__(self, width: int):
            super().__init__()
            self.width = width

        def forward(self, x):
            return torch.full((*x.shape[:-1], self.width), 1e4, dtype=x.dtype, device=x.device)

    return OpenGate(module.out_features)


def _identity_modules(family, model, layer_cfgs, paths_of, swap=None) -> int:
    """Replace the modules at ``paths_of(layer_cfg)`` in every decoder layer by the
    identity (or by ``swap(module)``); the number replaced."""

    n = 0
    modules, done = family.decoder_layers(model), set()
    for i in range(len(layer_cfgs)):
        # a cycled model's invocations share a module (Family.invocation_order): replaced once
        m = family.layer_module(model.config, i)
        if m >= len(modules):
            break
        if m in done:
            continue
        done.add(m)
        layer = modules[m]
        for path in paths_of(layer_cfgs[i]):
            parent, _, leaf = path.rpartition(".")
            try:
                owner = layer.get_submodule(parent) if parent else layer
            except AttributeError:
                continue
            mod = getattr(owner, leaf, None)
            # a module another switch of the same case already removed stays removed
            if isinstance(mod, torch.nn.Module) and not isinstance(mod, torch.nn.Identity):
                setattr(owner, leaf, torch.nn.Identity() if swap is None else swap(mod))
                n += 1
    return n
