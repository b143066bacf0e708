"""GPT-2 graphs as ggml's `examples/gpt-2/main.cpp` built them with ggml_allocr (Aug 2023).

Same tensors, creation order, names (none: ggml names them node_N/leaf_N when
the graph is built) and `ggml_build_forward_expand` calls as `gpt2_graph`, so
the node order matches the program's. The three inputs (tokens, positions,
KQ_scale) are allocated explicitly while the graph is built, before the walk.
Weights and the KV memory share one ggml context, laid out as ggml laid out
objects: a 32-byte object header and the 272-byte tensor struct before each
tensor's data, 16-byte aligned.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from alloctrace.allocator.build import Ctx
from alloctrace.allocator.layout import Layout
from alloctrace.allocator.profiles import DEFAULT_PROFILE, get_profile
from alloctrace.allocator.tensor import TYPE_SIZE, Graph

from .space import AddressSpace, place_consecutive, span

ALIGNMENT = 16  # GGML_MEM_ALIGN on x86-64 and arm64
BUFFER_PAD = 16  # mem_size = measured max_size + GGML_MEM_ALIGN
OBJECT_HEADER = 32 + 272  # GGML_OBJECT_SIZE + sizeof(struct ggml_tensor) in 2023
# where malloc put the model context's buffer in the fixture runs (0x7f76744c6010 with the linux
# layout): the only fitted address; every tensor address follows from the context layout
CONTEXT_OFFSET = 0xC6010


@dataclass(frozen=True)
class Gpt2Params:
    n_vocab: int = 50257
    n_ctx: int = 1024
    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12
    wtype: str = "f16"

    def check(self):
        for k, v in vars(self).items():
            if k != "wtype" and v <= 0:
                raise ValueError(f"{k} must be positive, got {v}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
        if self.wtype not in TYPE_SIZE:
            raise ValueError(f"unknown weight type {self.wtype!r}")


@dataclass
class Gpt2Model:
    hp: Gpt2Params
    n_ctx: int
    globals: dict
    layers: list
    memory_k: object
    memory_v: object
    tensors: list = field(default_factory=list)  # context order: weights, then KV memory


def new_model(hp: Gpt2Params, n_ctx: int, profile: str = "") -> Gpt2Model:
    """gpt2_model_load: every tensor in one context, in the program's creation order (unnamed)."""
    hp.check()
    ctx = Ctx(legacy=True)
    E, V, wt = hp.n_embd, hp.n_vocab, hp.wtype
    t = ctx.new_tensor
    glob = {"ln_f_g": t("f32", (E,)), "ln_f_b": t("f32", (E,)), "wte": t(wt, (E, V)), "wpe": t("f32", (E, n_ctx)),
            "lm_head": t(wt, (E, V))}
    tensors = list(glob.values())
    layers = []
    for _ in range(hp.n_layer):
        layer = {"ln_1_g": t("f32", (E,)), "ln_1_b": t("f32", (E,)), "ln_2_g": t("f32", (E,)),
                 "ln_2_b": t("f32", (E,)), "c_attn_attn_w": t(wt, (E, 3 * E)), "c_attn_attn_b": t("f32", (3 * E,)),
                 "c_attn_proj_w": t(wt, (E, E)), "c_attn_proj_b": t("f32", (E,)),
                 "c_mlp_fc_w": t(wt, (E, 4 * E)), "c_mlp_fc_b": t("f32", (4 * E,)),
                 "c_mlp_proj_w": t(wt, (4 * E, E)), "c_mlp_proj_b": t("f32", (E,))}
        layers.append(layer)
        tensors.extend(layer.values())
    n_elements = E * hp.n_layer * n_ctx
    memory_k, memory_v = t("f32", (n_elements,)), t("f32", (n_elements,))
    tensors += [memory_k, memory_v]
    return Gpt2Model(hp, n_ctx, glob, layers, memory_k, memory_v, tensors)


def place_model(model: Gpt2Model, layout: Layout, space: AddressSpace):
    size = CONTEXT_OFFSET + span(model.tensors, ALIGNMENT, OBJECT_HEADER)
    base = space.reserve("weights", layout.weights_base, size)
    place_consecutive(model.tensors, base + CONTEXT_OFFSET, ALIGNMENT, OBJECT_HEADER)


def measure_shape(n_ctx: int, n_batch: int) -> tuple[int, int]:
    """main(): n_tokens = min(n_ctx, n_batch), n_past = n_ctx - n_tokens."""
    n_tokens = min(n_ctx, n_batch)
    return n_tokens, n_ctx - n_tokens


def build_graph(model: Gpt2Model, n_tokens: int, n_past: int, alloc, profile: str = "") -> Graph:
    """One gpt2_graph call; `alloc(t)` is ggml_allocr_alloc on the program's allocator."""
    hp, n_ctx, N = model.hp, model.n_ctx, n_tokens
    E, H = hp.n_embd, hp.n_head
    ctx = Ctx(legacy=True)
    gf = Graph([], [])
    # ggml 854e4530's (and f03d74aa's) ggml_repeat returned `a` itself when the shapes already matched
    # (N == 1); ea9193f0 always made a REPEAT node
    shortcut = get_profile(profile or DEFAULT_PROFILE).repeat_returns_same_shape

    def repeat(a, b):
        return a if shortcut and a.ne == b.ne else ctx.repeat(a, b)

    def norm_affine(x, g, b):
        cur = ctx.norm(x)
        return ctx.add(ctx.mul(repeat(g, cur), cur), repeat(b, cur))

    def linear(w, bias, x):
        cur = ctx.mul_mat(w, x)
        return ctx.add(repeat(bias, cur), cur)

    embd = ctx.new_tensor_1d("i32", N)
    alloc(embd)
    position = ctx.new_tensor_1d("i32", N)
    alloc(position)
    kq_scale = ctx.new_tensor_1d("f32", 1)
    alloc(kq_scale)

    g = model.globals
    inpL = ctx.add(ctx.get_rows(g["wte"], embd), ctx.get_rows(g["wpe"], position))
    mk, mv = model.memory_k, model.memory_v
    esk, esv = TYPE_SIZE[mk.type], TYPE_SIZE[mv.type]
    for il, L in enumerate(model.layers):
        cur = norm_affine(inpL, L["ln_1_g"], L["ln_1_b"])
        cur = linear(L["c_attn_attn_w"], L["c_attn_attn_b"], cur)

        Qcur = ctx.view_2d(cur, E, N, cur.nb[1], 0 * 4 * E)
        Kcur = ctx.view_2d(cur, E, N, cur.nb[1], 1 * 4 * E)
        Vcur = ctx.view_2d(cur, E, N, cur.nb[1], 2 * 4 * E)
        if N >= 1:
            k = ctx.view_1d(mk, N * E, esk * E * (il * n_ctx + n_past))
            v = ctx.view_1d(mv, N * E, esv * E * (il * n_ctx + n_past))
            ctx.build_forward(ctx.cpy(Kcur, k), graph=gf)
            ctx.build_forward(ctx.cpy(Vcur, v), graph=gf)

        Q = ctx.permute(ctx.cpy(Qcur, ctx.new_tensor_3d("f32", E // H, H, N)), 0, 2, 1, 3)
        K = ctx.permute(ctx.reshape_3d(ctx.view_1d(mk, (n_past + N) * E, il * n_ctx * esk * E), E // H, H, n_past + N),
                        0, 2, 1, 3)
        KQ = ctx.mul_mat(K, Q)
        KQ_scaled = ctx.scale(KQ, kq_scale)
        KQ_masked = ctx.diag_mask_inf(KQ_scaled, n_past)
        KQ_soft_max = ctx.soft_max(KQ_masked)
        V_trans = ctx.cpy(
            ctx.permute(ctx.reshape_3d(ctx.view_1d(mv, (n_past + N) * E, il * n_ctx * esv * E), E // H, H, n_past + N),
                        1, 2, 0, 3),
            ctx.new_tensor_3d(mv.type, n_past + N, E // H, H))
        KQV = ctx.mul_mat(V_trans, KQ_soft_max)
        KQV_merged = ctx.permute(KQV, 0, 2, 1, 3)
        cur = ctx.cpy(KQV_merged, ctx.new_tensor_2d("f32", E, N))

        cur = linear(L["c_attn_proj_w"], L["c_attn_proj_b"], cur)
        inpFF = ctx.add(cur, inpL)
        cur = norm_affine(inpFF, L["ln_2_g"], L["ln_2_b"])
        cur = linear(L["c_mlp_fc_w"], L["c_mlp_fc_b"], cur)
        cur = ctx.gelu(cur)
        cur = linear(L["c_mlp_proj_w"], L["c_mlp_proj_b"], cur)
        inpL = ctx.add(cur, inpFF)

    inpL = norm_affine(inpL, g["ln_f_g"], g["ln_f_b"])
    inpL = ctx.mul_mat(g["lm_head"], inpL)
    return ctx.build_forward(inpL, graph=gf)
