"""Model presets: the graphs real programs built, by name.

A preset is a family (how the program built its graphs and sized its buffer)
plus hyper-parameters. `family_of(preset)` gives the module with
`new_model`, `place_model`, `measure_shape`, `build_graph`, `ALIGNMENT` and
`BUFFER_PAD`; `with_hparams` makes a custom preset from flags.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from . import falcon, gpt2, llama
from .falcon import FalconParams
from .gpt2 import Gpt2Params
from .llama import LlamaParams

FAMILIES = {"llama": llama, "gpt2": gpt2, "falcon": falcon}


@dataclass(frozen=True)
class Preset:
    name: str
    family: str  # "llama" / "falcon" (llama.cpp, Aug 2023) or "gpt2" (ggml examples/gpt-2, Aug 2023)
    hparams: object  # LlamaParams | Gpt2Params | FalconParams
    description: str = ""
    n_ctx: int = 512  # the program's default context
    n_batch: int = 512  # the program's default batch

    def to_json(self) -> dict:
        return {"name": self.name, "family": self.family, "description": self.description,
                "n_ctx": self.n_ctx, "n_batch": self.n_batch, "hparams": dataclasses.asdict(self.hparams)}


def _llama(name, desc, **hp):
    return Preset(name, "llama", LlamaParams(**hp), desc)


def _falcon(name, desc, **hp):
    return Preset(name, "falcon", FalconParams(**hp), desc)


def _gpt2(name, desc, **hp):
    p = Gpt2Params(**hp)
    return Preset(name, "gpt2", p, desc, n_ctx=p.n_ctx, n_batch=8)


PRESETS = {p.name: p for p in [
    _llama("llama-7b", "LLaMA 7B", n_embd=4096, n_head=32, n_head_kv=32, n_layer=32, n_ff=11008),
    _llama("llama-13b", "LLaMA 13B", n_embd=5120, n_head=40, n_head_kv=40, n_layer=40, n_ff=13824),
    _llama("llama-33b", "LLaMA 33B (30B)", n_embd=6656, n_head=52, n_head_kv=52, n_layer=60, n_ff=17920),
    _llama("llama-65b", "LLaMA 65B", n_embd=8192, n_head=64, n_head_kv=64, n_layer=80, n_ff=22016),
    _llama("llama2-70b", "LLaMA-2 70B, grouped-query attention", n_embd=8192, n_head=64, n_head_kv=8,
           n_layer=80, n_ff=28672),
    _llama("open-llama-3b", "OpenLLaMA 3B", n_embd=3200, n_head=32, n_head_kv=32, n_layer=26, n_ff=8640),
    _falcon("falcon-7b", "Falcon 7B, multi-query attention (llm_build_falcon, GGUF)", n_embd=4544, n_head=71,
            n_head_kv=1, n_layer=32, n_ff=18176),
    _falcon("falcon-40b", "Falcon 40B, 8 KV heads and a second LayerNorm", n_embd=8192, n_head=128, n_head_kv=8,
            n_layer=60, n_ff=32768, attn_norm_2=1),
    _gpt2("gpt2-tiny", "GPT-2 tiny: the fixture logs' synthetic model", n_vocab=512, n_ctx=128, n_embd=128,
          n_head=4, n_layer=2),
    _gpt2("gpt2-117m", "GPT-2 117M", n_vocab=50257, n_ctx=1024, n_embd=768, n_head=12, n_layer=12),
    _gpt2("gpt2-345m", "GPT-2 345M", n_vocab=50257, n_ctx=1024, n_embd=1024, n_head=16, n_layer=24),
]}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None


def family_of(preset: Preset):
    return FAMILIES[preset.family]


def with_hparams(preset: Preset, overrides: dict) -> Preset:
    """A copy with some hyper-parameters replaced (values as strings or ints, from flags)."""
    if not overrides:
        return preset
    fields = {f.name: f.type for f in dataclasses.fields(preset.hparams)}
    values = {}
    for key, raw in overrides.items():
        if key not in fields:
            raise ValueError(f"unknown hyper-parameter {key!r} for {preset.name}; known: {', '.join(fields)}")
        if key == "wtype":
            values[key] = str(raw)
            continue
        try:
            values[key] = int(raw)
        except (TypeError, ValueError):
            raise ValueError(f"hyper-parameter {key} must be an integer, got {raw!r}") from None
    hp = dataclasses.replace(preset.hparams, **values)
    hp.check()
    extra = dict(n_ctx=hp.n_ctx) if preset.family == "gpt2" else {}
    return dataclasses.replace(preset, name=f"{preset.name}(custom)", hparams=hp, **extra)


__all__ = ["PRESETS", "Preset", "get_preset", "family_of", "with_hparams", "LlamaParams", "Gpt2Params", "FalconParams"]
