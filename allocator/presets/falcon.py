"""Falcon graphs as llama.cpp's `llm_build_falcon` built them in late August 2023.

Written from llama.cpp at 38b16dfc (PR #2757, 2023-08-24), whose Falcon graph
is that of cf658adc (PR #2717, which added Falcon with GGUF) minus one line:
PR #2717 set `cur->src[2] = attn_out` on the FFN's up projection, an
artificial dependency "because there seems to be a bug in the Metal
concurrency optimization"; PR #2757 fixed the allocator and removed it.
`FalconModel.ff_waits_for_attn` puts it back, to replay the graph PR #2717
shipped. Per layer: LayerNorm (+ bias), fused QKV projection split by strided
views, NeoX rope applied in place to the Q and K views, K/V cache writes, the
LLaMA attention core, and an FFN (up, GELU, down) fed by the same normed input
as attention, both added to the layer input (parallel attention).

Everything the program did around the graph is LLaMA's (one llama.cpp), so
alignment, buffer padding, metadata bytes and the measure shape come from
allocator/presets/llama.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from alloctrace.allocator.build import Ctx
from alloctrace.allocator.tensor import TYPE_SIZE, Graph

from . import llama

# the family API: one llama.cpp sized and measured every architecture's graph the same way
ALIGNMENT = llama.ALIGNMENT
BUFFER_PAD = llama.BUFFER_PAD
metadata_bytes = llama.metadata_bytes
measure_shape = llama.measure_shape


@dataclass(frozen=True)
class FalconParams(llama.Heads):
    n_vocab: int = 65024
    n_embd: int = 4544
    n_head: int = 71
    n_head_kv: int = 1
    n_layer: int = 32
    n_ff: int = 18176
    attn_norm_2: int = 0  # 1: a second LayerNorm feeds QKV (Falcon-40B's ln_attn / ln_mlp)

    def check(self):
        for k, v in vars(self).items():
            if k != "attn_norm_2" and v <= 0:
                raise ValueError(f"{k} must be positive, got {v}")
        if self.attn_norm_2 not in (0, 1):
            raise ValueError(f"attn_norm_2 must be 0 or 1, got {self.attn_norm_2}")
        self.check_heads()


# GGUF tensor names (llama.cpp LLM_TENSOR_NAMES for LLM_ARCH_FALCON)
_GLOBAL = {"tok_embeddings": "token_embd.weight", "output_norm": "output_norm.weight",
           "output_norm_b": "output_norm.bias", "output": "output.weight"}
_LAYER = {"attn_norm": "blk.{}.attn_norm.weight", "attn_norm_b": "blk.{}.attn_norm.bias",
          "attn_norm_2": "blk.{}.attn_norm_2.weight", "attn_norm_2_b": "blk.{}.attn_norm_2.bias",
          "wqkv": "blk.{}.attn_qkv.weight", "wo": "blk.{}.attn_output.weight",
          "w2": "blk.{}.ffn_down.weight", "w3": "blk.{}.ffn_up.weight"}


@dataclass
class FalconModel:
    hp: FalconParams
    n_ctx: int
    globals: dict
    layers: list
    cache_k: object
    cache_v: object
    weights: list = field(default_factory=list)  # in load order
    ff_waits_for_attn: bool = False  # PR #2717's workaround: the up projection gets src[2] = attn_out

    @property
    def kv(self) -> list:
        return [self.cache_k, self.cache_v]


def new_model(hp: FalconParams, n_ctx: int, profile: str = "", wtype: str = "f16",
              ff_waits_for_attn: bool = False) -> FalconModel:
    """Weights in llm_load_tensors' order and the f16 KV cache (Falcon came with GGUF: one naming)."""
    hp.check()
    ctx = Ctx(legacy=True)

    def w(name, type_, *ne):
        return ctx.set_name(ctx.new_tensor(type_, ne), name)

    E, V, F, G = hp.n_embd, hp.n_vocab, hp.n_ff, hp.n_embd_gqa
    glob = {"tok_embeddings": w(_GLOBAL["tok_embeddings"], wtype, E, V),
            "output_norm": w(_GLOBAL["output_norm"], "f32", E),
            "output_norm_b": w(_GLOBAL["output_norm_b"], "f32", E),
            "output": w(_GLOBAL["output"], wtype, E, V)}
    weights = list(glob.values())
    layers = []
    for il in range(hp.n_layer):
        n = {k: v.format(il) for k, v in _LAYER.items()}
        layer = {"attn_norm": w(n["attn_norm"], "f32", E), "attn_norm_b": w(n["attn_norm_b"], "f32", E)}
        if hp.attn_norm_2:
            layer["attn_norm_2"] = w(n["attn_norm_2"], "f32", E)
            layer["attn_norm_2_b"] = w(n["attn_norm_2_b"], "f32", E)
        layer["wqkv"] = w(n["wqkv"], wtype, E, E + 2 * G)
        layer["wo"] = w(n["wo"], wtype, E, E)
        layer["w2"] = w(n["w2"], wtype, F, E)
        layer["w3"] = w(n["w3"], wtype, E, F)
        layers.append(layer)
        weights.extend(layer.values())
    cache_k, cache_v = llama.kv_cache(G, n_ctx, hp.n_layer)
    return FalconModel(hp, n_ctx, glob, layers, cache_k, cache_v, weights, ff_waits_for_attn)


place_model = llama.place_model  # weights in one mapping, the KV cache in its own buffer


def _layer_norm(ctx: Ctx, x, weight, bias):
    """ggml_add(ggml_mul(ggml_norm(x), weight), bias): three unnamed nodes."""
    return ctx.add(ctx.mul(ctx.norm(x), weight), bias)


def build_graph(model: FalconModel, n_tokens: int, n_past: int, alloc, profile: str = "") -> Graph:
    """One llm_build_falcon call; `alloc(t)` is ggml_allocr_alloc on the program's allocator."""
    hp, N = model.hp, n_tokens
    ctx = Ctx(legacy=True)
    name = ctx.set_name
    gf = Graph([], [])
    D, H, HKV, G = hp.n_embd_head, hp.n_head, hp.n_head_kv, hp.n_embd_gqa
    inpL, kq_scale = llama.graph_inputs(ctx, model, N, alloc)

    for il, L in enumerate(model.layers):
        attn_norm = _layer_norm(ctx, inpL, L["attn_norm"], L["attn_norm_b"])
        cur = _layer_norm(ctx, inpL, L["attn_norm_2"], L["attn_norm_2_b"]) if hp.attn_norm_2 else attn_norm

        qkv = ctx.mul_mat(L["wqkv"], cur)  # rows: n_head Q heads, then n_head_kv K heads, then V heads
        ws = TYPE_SIZE[qkv.type]
        row = ws * D * (H + 2 * HKV)
        tmpq = ctx.view_3d(qkv, D, H, N, ws * D, row, 0)
        tmpk = ctx.view_3d(qkv, D, HKV, N, ws * D, row, ws * D * H)
        tmpv = ctx.view_3d(qkv, D, HKV, N, ws * D, row, ws * D * (H + HKV))
        Qcur = ctx.rope_custom_inplace(tmpq, n_past, D, 2)  # mode 2: NeoX
        Kcur = ctx.rope_custom_inplace(tmpk, n_past, D, 2)

        Vcur = name(ctx.transpose(ctx.reshape_2d(ctx.cont(tmpv), G, N)), "Vcur")
        llama.store_kv(ctx, model, gf, il, Kcur, Vcur, N, n_past)
        cur = llama.attention(ctx, model, il, Qcur, kq_scale, N, n_past, inplace=True)
        attn_out = name(ctx.mul_mat(L["wo"], cur), "result_wo")

        cur = ctx.mul_mat(L["w3"], attn_norm)  # the FFN reads the attention's input, not its output
        if model.ff_waits_for_attn:
            cur.srcs.append(attn_out)
        cur = ctx.gelu(cur)
        cur = ctx.mul_mat(L["w2"], cur)
        cur = ctx.add(cur, attn_out)
        inpL = ctx.add(cur, inpL)

    cur = name(_layer_norm(ctx, inpL, model.globals["output_norm"], model.globals["output_norm_b"]), "result_norm")
    cur = name(ctx.mul_mat(model.globals["output"], cur), "result_output")
    return ctx.build_forward(cur, graph=gf)
