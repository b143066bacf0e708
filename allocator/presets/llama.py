"""LLaMA graphs as llama.cpp's `llama_build_graph` built them in August 2023.

Written from the behaviour of llama.cpp between PR #2627 (Metal + ggml-alloc,
pre-GGUF) and the first GGUF releases: the same tensors, names, shapes and
`ggml_build_forward_expand` calls, so the node order and names come out as
the program's did. Weights and KV cache are created once per model and live
outside the compute buffer; each graph build makes its own context, as
llama.cpp did per eval, and allocates the token input and KQ_scale explicitly
while building (they print unnamed: they were named after allocation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from alloctrace.allocator.build import Ctx
from alloctrace.allocator.layout import Layout
from alloctrace.allocator.profiles import DEFAULT_PROFILE, get_profile
from alloctrace.allocator.tensor import TYPE_SIZE, Graph

from .space import AddressSpace, place_consecutive, span

ALIGNMENT = 32  # llama.cpp's tensor_alignment for the allocator
BUFFER_PAD = 32  # alloc_size = measured max_size + tensor_alignment

# ggml_tensor_overhead()*GGML_MAX_NODES + ggml_graph_overhead(): the graph metadata buffer that
# llama.cpp counted in "compute buffer total size" (GGML_MAX_NAME went from 48 to 64 with GGUF,
# between 854e4530 and f03d74aa: 16 more bytes per tensor, 4096 tensors)
# (the numbers are the profiles' llama_metadata_bytes)
def metadata_bytes(profile) -> int:
    return get_profile(profile).llama_metadata_bytes


class Heads:
    """n_embd split into n_head heads, n_head_kv of them for K and V (grouped-query attention)."""

    @property
    def n_embd_head(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:
        return self.n_embd_head * self.n_head_kv

    def check_heads(self):
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")


def kv_cache(n_embd_gqa: int, n_ctx: int, n_layer: int) -> tuple:
    """llama.cpp's KV cache: two f16 1-D tensors in a context of their own (f16_kv=true)."""
    n_elements = n_embd_gqa * n_ctx * n_layer
    ctx = Ctx(legacy=True)
    return (ctx.set_name(ctx.new_tensor_1d("f16", n_elements), "cache_k"),
            ctx.set_name(ctx.new_tensor_1d("f16", n_elements), "cache_v"))


@dataclass(frozen=True)
class LlamaParams(Heads):
    n_vocab: int = 32000
    n_embd: int = 4096
    n_head: int = 32
    n_head_kv: int = 32
    n_layer: int = 32
    n_ff: int = 11008

    def check(self):
        for k, v in vars(self).items():
            if v <= 0:
                raise ValueError(f"{k} must be positive, got {v}")
        self.check_heads()


# tensor names: the pre-GGUF loader named tensors after the .pth keys, GGUF after its own scheme
_NAMES = {
    "pre-gguf": {
        "tok_embeddings": "tok_embeddings.weight", "norm": "norm.weight", "output": "output.weight",
        "attention_norm": "layers.{}.attention_norm.weight", "wq": "layers.{}.attention.wq.weight",
        "wk": "layers.{}.attention.wk.weight", "wv": "layers.{}.attention.wv.weight",
        "wo": "layers.{}.attention.wo.weight", "ffn_norm": "layers.{}.ffn_norm.weight",
        "w1": "layers.{}.feed_forward.w1.weight", "w2": "layers.{}.feed_forward.w2.weight",
        "w3": "layers.{}.feed_forward.w3.weight",
    },
    "gguf": {
        "tok_embeddings": "token_embd.weight", "norm": "output_norm.weight", "output": "output.weight",
        "attention_norm": "blk.{}.attn_norm.weight", "wq": "blk.{}.attn_q.weight", "wk": "blk.{}.attn_k.weight",
        "wv": "blk.{}.attn_v.weight", "wo": "blk.{}.attn_output.weight", "ffn_norm": "blk.{}.ffn_norm.weight",
        "w1": "blk.{}.ffn_gate.weight", "w2": "blk.{}.ffn_down.weight", "w3": "blk.{}.ffn_up.weight",
    },
}


@dataclass
class LlamaModel:
    hp: LlamaParams
    n_ctx: int
    globals: dict
    layers: list
    cache_k: object
    cache_v: object
    weights: list = field(default_factory=list)  # in load order

    @property
    def kv(self) -> list:
        return [self.cache_k, self.cache_v]


def new_model(hp: LlamaParams, n_ctx: int, profile: str, wtype: str = "f16") -> LlamaModel:
    """The model context (weights in load order) and the KV cache context (f16, as f16_kv=true)."""
    hp.check()
    names = _NAMES[get_profile(profile or DEFAULT_PROFILE).llama_names]
    ctx = Ctx(legacy=True)

    def w(key, il, type_, *ne):
        return ctx.set_name(ctx.new_tensor(type_, ne), names[key].format(il))

    E, V, F, G = hp.n_embd, hp.n_vocab, hp.n_ff, hp.n_embd_gqa
    glob = {"tok_embeddings": w("tok_embeddings", 0, wtype, E, V), "norm": w("norm", 0, "f32", E),
            "output": w("output", 0, wtype, E, V)}
    weights = list(glob.values())
    layers = []
    for il in range(hp.n_layer):
        layer = {
            "attention_norm": w("attention_norm", il, "f32", E),
            "wq": w("wq", il, wtype, E, E), "wk": w("wk", il, wtype, E, G), "wv": w("wv", il, wtype, E, G),
            "wo": w("wo", il, wtype, E, E),
            "ffn_norm": w("ffn_norm", il, "f32", E),
            "w1": w("w1", il, wtype, E, F), "w2": w("w2", il, wtype, F, E), "w3": w("w3", il, wtype, E, F),
        }
        layers.append(layer)
        weights.extend(layer.values())
    cache_k, cache_v = kv_cache(G, n_ctx, hp.n_layer)
    return LlamaModel(hp, n_ctx, glob, layers, cache_k, cache_v, weights)


def place_model(model: LlamaModel, layout: Layout, space: AddressSpace):
    """Weights in one mapping, the KV cache in its own buffer."""
    base = space.reserve("weights", layout.weights_base, span(model.weights, ALIGNMENT))
    place_consecutive(model.weights, base, ALIGNMENT)
    base = space.reserve("kv", layout.kv_base, span(model.kv, ALIGNMENT))
    place_consecutive(model.kv, base, ALIGNMENT)


def measure_shape(n_ctx: int, n_batch: int) -> tuple[int, int]:
    """llama_new_context_with_model's worst case: n_tokens = min(n_ctx, n_batch), n_past = n_ctx - n_tokens."""
    n_tokens = min(n_ctx, n_batch)
    return n_tokens, n_ctx - n_tokens


def graph_inputs(ctx: Ctx, model, N: int, alloc):
    """The token input and KQ_scale, allocated explicitly before the walk; returns (embeddings, kq_scale)."""
    inp_tokens = ctx.new_tensor_1d("i32", N)
    alloc(inp_tokens)
    ctx.set_name(inp_tokens, "inp_tokens")
    inpL = ctx.get_rows(model.globals["tok_embeddings"], inp_tokens)
    kq_scale = ctx.new_tensor_1d("f32", 1)
    alloc(kq_scale)
    ctx.set_name(kq_scale, "1/sqrt(n_embd_head)")
    return inpL, kq_scale


def store_kv(ctx: Ctx, model, gf: Graph, il: int, Kcur, Vcur, N: int, n_past: int):
    """Copy this batch's K and V into layer il of the cache (expanded into the graph right away)."""
    G, n_ctx, es = model.hp.n_embd_gqa, model.n_ctx, TYPE_SIZE[model.cache_k.type]
    k = ctx.set_name(ctx.view_1d(model.cache_k, N * G, es * G * (il * n_ctx + n_past)), "k")
    v = ctx.set_name(ctx.view_2d(model.cache_v, N, G, n_ctx * es, il * n_ctx * es * G + n_past * es), "v")
    ctx.build_forward(ctx.cpy(Kcur, k), graph=gf)
    ctx.build_forward(ctx.cpy(Vcur, v), graph=gf)


def attention(ctx: Ctx, model, il: int, Qcur, kq_scale, N: int, n_past: int, inplace: bool = False):
    """Q against the cached K and V of layer il, up to KQV_merged_contiguous (Falcon used the in-place ops)."""
    hp, n_ctx, es = model.hp, model.n_ctx, TYPE_SIZE[model.cache_k.type]
    D, HKV, G = hp.n_embd_head, hp.n_head_kv, hp.n_embd_gqa
    name = ctx.set_name
    scale, mask, soft_max = ((ctx.scale_inplace, ctx.diag_mask_inf_inplace, ctx.soft_max_inplace) if inplace
                             else (ctx.scale, ctx.diag_mask_inf, ctx.soft_max))
    Q = name(ctx.permute(Qcur, 0, 2, 1, 3), "Q")
    K = name(ctx.view_3d(model.cache_k, D, n_past + N, HKV, es * G, es * D, es * G * n_ctx * il), "K")
    KQ = name(ctx.mul_mat(K, Q), "KQ")
    KQ_scaled = name(scale(KQ, kq_scale), "KQ_scaled")
    KQ_masked = name(mask(KQ_scaled, n_past), "KQ_masked")
    KQ_soft_max = name(soft_max(KQ_masked), "KQ_soft_max")
    V = name(ctx.view_3d(model.cache_v, n_past + N, D, HKV, es * n_ctx, es * n_ctx * D, es * n_ctx * G * il), "V")
    KQV = name(ctx.mul_mat(V, KQ_soft_max), "KQV")
    KQV_merged = name(ctx.permute(KQV, 0, 2, 1, 3), "KQV_merged")
    return name(ctx.cpy(KQV_merged, ctx.new_tensor_2d("f32", hp.n_embd, N)), "KQV_merged_contiguous")


def build_graph(model: LlamaModel, n_tokens: int, n_past: int, alloc, profile: str = "") -> Graph:
    """One llama_build_graph call; `alloc(t)` is ggml_allocr_alloc on the program's allocator."""
    hp, N = model.hp, n_tokens
    ctx = Ctx(legacy=True)
    name = ctx.set_name
    gf = Graph([], [])
    D, H, HKV, G = hp.n_embd_head, hp.n_head, hp.n_head_kv, hp.n_embd_gqa
    inpL, kq_scale = graph_inputs(ctx, model, N, alloc)

    for il, L in enumerate(model.layers):
        name(inpL, f"layer_inp_{il}")
        inpSA = inpL
        cur = name(ctx.rms_norm(inpL), "rms_norm_0")
        cur = name(ctx.mul(cur, L["attention_norm"]), "attention_norm_0")

        tmpk = name(ctx.mul_mat(L["wk"], cur), "tmpk")
        tmpq = name(ctx.mul_mat(L["wq"], cur), "tmpq")
        Kcur = name(ctx.rope(ctx.reshape_3d(tmpk, D, HKV, N), n_past, D, 0), "Kcur")
        Qcur = name(ctx.rope(ctx.reshape_3d(tmpq, D, H, N), n_past, D, 0), "Qcur")

        tmpv = name(ctx.mul_mat(L["wv"], cur), "tmpv")
        Vcur = name(ctx.transpose(ctx.reshape_2d(tmpv, G, N)), "Vcur")
        store_kv(ctx, model, gf, il, Kcur, Vcur, N, n_past)
        cur = attention(ctx, model, il, Qcur, kq_scale, N, n_past)
        cur = name(ctx.mul_mat(L["wo"], cur), "result_wo")

        inpFF = name(ctx.add(cur, inpSA), "inpFF")
        cur = name(ctx.rms_norm(inpFF), "rms_norm_1")
        cur = name(ctx.mul(cur, L["ffn_norm"]), "ffn_norm")
        tmp = name(ctx.mul_mat(L["w3"], cur), "result_w3")
        cur = name(ctx.mul_mat(L["w1"], cur), "result_w1")
        cur = name(ctx.silu(cur), "silu")
        cur = name(ctx.mul(cur, tmp), "silu_x_result_w3")
        cur = name(ctx.mul_mat(L["w2"], cur), "result_w2")
        inpL = name(ctx.add(cur, inpFF), "inpFF_+_result_w2")

    cur = name(ctx.rms_norm(inpL), "rms_norm_2")
    cur = name(ctx.mul(cur, model.globals["norm"]), "result_norm")
    cur = name(ctx.mul_mat(model.globals["output"], cur), "result_output")
    return ctx.build_forward(cur, graph=gf)
