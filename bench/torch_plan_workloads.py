"""The training steps `alloctrace plan` is checked against: plain PyTorch, no weights downloaded.

One file serves both sides: `bench/record_torch_plan_truths.py` runs these steps on a GPU machine (H200) and
records what the caching allocator really did; the tests run the same steps under `alloctrace plan` on a CPU
and compare. Models are built directly on the CUDA device (`with torch.device("cuda")`), inputs are random.

Attention is written out (matmul, mask, softmax); the steps at the end (`SDPA_MODELS`) use
`scaled_dot_product_attention` (and nn.TransformerEncoder), which the plan follows (docs/torch-plan.md).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=1024, hidden=4096, classes=1000):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))
        self.d_in = d_in
        self.classes = classes

    def batch(self, n):
        return torch.randn(n, self.d_in, device="cuda"), torch.randint(0, self.classes, (n,), device="cuda")

    def loss(self, x, y):
        return F.cross_entropy(self.net(x), y)


class Attention(nn.Module):
    def __init__(self, dim, heads, causal, ctx):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads
        self.causal = causal
        if causal:
            self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, dim, heads, causal, ctx):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, causal, ctx)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT-2-like decoder from a config (tied embeddings, learned positions, pre-norm blocks)."""

    def __init__(self, vocab=8192, ctx=256, dim=512, heads=8, layers=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, True, ctx) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.vocab, self.ctx = vocab, ctx

    def batch(self, n):
        idx = torch.randint(0, self.vocab, (n, self.ctx + 1), device="cuda")
        return idx[:, :-1], idx[:, 1:]

    def loss(self, idx, targets):
        t = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


class ViT(nn.Module):
    """A ViT-like encoder: patches by reshaping (no convolution), a class token, pre-norm blocks."""

    def __init__(self, image=224, patch=16, dim=384, heads=6, layers=6, classes=1000):
        super().__init__()
        self.patch, self.image = patch, image
        n = (image // patch) ** 2
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, False, n + 1) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.classes = classes

    def batch(self, n):
        return (torch.randn(n, 3, self.image, self.image, device="cuda"),
                torch.randint(0, self.classes, (n,), device="cuda"))

    def loss(self, img, y):
        b, p = img.size(0), self.patch
        x = img.unfold(2, p, p).unfold(3, p, p).permute(0, 2, 3, 1, 4, 5).reshape(b, -1, 3 * p * p)
        x = self.embed(x)
        x = torch.cat([self.cls.expand(b, -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return F.cross_entropy(self.head(self.ln(x[:, 0])), y)


MODELS = {"mlp": MLP, "gpt": GPT, "vit": ViT}
OPTIMIZERS = {"mlp": lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
              "gpt": lambda ps: torch.optim.AdamW(ps, lr=3e-4, weight_decay=0.1),
              "vit": lambda ps: torch.optim.AdamW(ps, lr=1e-3)}
BATCHES = {"mlp": (64, 256, 1024), "gpt": (4, 8, 16), "vit": (16, 32, 64)}
DTYPES = ("fp32", "bf16")
STEPS = 2


def train(name: str, batch: int, dtype: str, steps: int = STEPS):
    """Build `name` on the CUDA device and run `steps` training steps at `batch`; everything is freed after."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = MODELS[name]() if name in MODELS else SDPA_MODELS[name]()
    opt = OPTIMIZERS[name](model.parameters())
    for _ in range(steps):
        x, y = model.batch(batch)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model.loss(x, y)
        loss.backward()
        opt.step()
        del x, y, loss


# -- variants, recorded later (record_torch_plan_truths.py --variants): kept below the code above, whose lines are
#    those of the snapshots in tests/data/torch/plan/ -------------------------------------------------------------

VARIANTS = {"accumulate2": {"accumulate": 2, "zero_grad_first": True},
            "checkpoint": {"checkpoint": True, "zero_grad_first": True},
            "zero_grad_keep": {"set_to_none": False, "zero_grad_first": True}}


def _checkpointed(self, x):
    import torch.utils.checkpoint
    return torch.utils.checkpoint.checkpoint(_plain_forward.__get__(self), x, use_reentrant=False)


_plain_forward = Block.forward


def train_variant(name: str, batch: int, dtype: str, steps: int = STEPS, *, accumulate: int = 1,
                  checkpoint: bool = False, set_to_none: bool = True, zero_grad_first: bool = False):
    """`train` with gradient accumulation over `accumulate` micro-batches, activation checkpointing of every
    block (non-reentrant), `zero_grad(set_to_none=...)`, and dtype fp16 (autocast and a GradScaler).

    By default the order is `train`'s (the batch made before `zero_grad`, the step's tensors alive through
    `opt.step()`); `zero_grad_first` zeroes first, divides the loss by `accumulate` and drops each micro-batch
    after its backward (the order variants.json was recorded with)."""
    torch.manual_seed(0)
    Block.forward = _checkpointed if checkpoint else _plain_forward
    try:
        with torch.device("cuda"):
            model = MODELS[name]()
        opt = OPTIMIZERS[name](model.parameters())
        scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None
        amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
        for _ in range(steps):
            if zero_grad_first:
                opt.zero_grad(set_to_none=set_to_none)
            for i in range(accumulate):
                x, y = model.batch(batch)
                if not zero_grad_first and i == 0:
                    opt.zero_grad(set_to_none=set_to_none)
                with torch.autocast("cuda", dtype=amp or torch.float32, enabled=amp is not None):
                    loss = model.loss(x, y)
                    if zero_grad_first:
                        loss = loss / accumulate
                (scaler.scale(loss) if scaler else loss).backward()
                if zero_grad_first:
                    del x, y, loss
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            if not zero_grad_first:
                del x, y, loss
    finally:
        Block.forward = _plain_forward


# -- ResNet-50 and reentrant checkpointing, recorded later (record_torch_plan_truths.py --more) ----------------

class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * 4
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        y = F.relu(self.bn2(self.conv2(y)), inplace=True)
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)), inplace=True)


class ResNet50(nn.Module):
    """ResNet-50's layout (torchvision's v1.5: stride on the 3x3), written out; no weights."""

    def __init__(self, image=224, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        self.image, self.classes = image, classes

    def batch(self, n):
        return (torch.randn(n, 3, self.image, self.image, device="cuda"),
                torch.randint(0, self.classes, (n,), device="cuda"))

    def loss(self, img, y):
        x = self.layers(self.stem(img))
        return F.cross_entropy(self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)), y)


MODELS["resnet50"] = ResNet50
OPTIMIZERS["resnet50"] = lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=1e-4)
RESNET_BATCHES = (16, 32, 64)
BATCHES = {**BATCHES, "resnet50": RESNET_BATCHES}


def _checkpointed_reentrant(self, x):
    import torch.utils.checkpoint
    return torch.utils.checkpoint.checkpoint(_plain_forward.__get__(self), x, use_reentrant=True)


VARIANTS_MORE = {"checkpoint_reentrant": {"checkpoint": "reentrant", "zero_grad_first": True},
                 "checkpoint": {"checkpoint": True, "zero_grad_first": True}}


def train_checkpoint_reentrant(name: str, batch: int, dtype: str, steps: int = STEPS):
    """`train_variant(..., checkpoint=True, zero_grad_first=True)` with `use_reentrant=True`."""
    Block.forward = _checkpointed_reentrant
    saved = globals()["_checkpointed"]
    globals()["_checkpointed"] = _checkpointed_reentrant
    try:
        return train_variant(name, batch, dtype, steps, checkpoint=True, zero_grad_first=True)
    finally:
        globals()["_checkpointed"] = saved
        Block.forward = _plain_forward


# -- attention through F.scaled_dot_product_attention (record_torch_plan_truths.py --sdpa): the GPU picks a fused
#    kernel (flash attention, memory-efficient attention) that keeps no [t, t] matrix ------------------------------

class SdpaAttention(nn.Module):
    def __init__(self, dim, heads, causal):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads, self.causal = heads, causal

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class SdpaBlock(Block):
    def __init__(self, dim, heads, causal):
        nn.Module.__init__(self)
        self.ln1 = nn.LayerNorm(dim)
        self.attn = SdpaAttention(dim, heads, causal)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)


class GPTSdpa(GPT):
    """GPT with a longer context and attention by scaled_dot_product_attention (as nanoGPT writes it)."""

    def __init__(self, vocab=8192, ctx=1024, dim=512, heads=8, layers=4):
        nn.Module.__init__(self)
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(SdpaBlock(dim, heads, True) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.vocab, self.ctx = vocab, ctx


class ViTSdpa(ViT):
    """ViT with attention by scaled_dot_product_attention (not causal)."""

    def __init__(self, image=224, patch=16, dim=384, heads=6, layers=6, classes=1000):
        nn.Module.__init__(self)
        self.patch, self.image = patch, image
        n = (image // patch) ** 2
        self.embed = nn.Linear(3 * patch * patch, dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        self.blocks = nn.ModuleList(SdpaBlock(dim, heads, False) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.classes = classes


SDPA_MODELS = {"gpt_sdpa": GPTSdpa, "vit_sdpa": ViTSdpa}
OPTIMIZERS["gpt_sdpa"] = OPTIMIZERS["gpt"]
OPTIMIZERS["vit_sdpa"] = OPTIMIZERS["vit"]
SDPA_BATCHES = {"gpt_sdpa": (2, 4, 8), "vit_sdpa": (16, 32, 64)}


class NanoBlock(nn.Module):
    """nanoGPT's block: bias-free layers, attention by scaled_dot_product_attention with dropout while training,
    dropout on both residual branches."""

    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim, bias=False), nn.LayerNorm(dim, bias=False)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.fc, self.out = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)
        self.drop, self.p, self.heads = nn.Dropout(dropout), dropout, heads

    def attend(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0, is_causal=True)
        return self.drop(self.proj(y.transpose(1, 2).contiguous().view(b, t, c)))

    def forward(self, x):
        x = x + self.attend(self.ln1(x))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class NanoGPT(GPT):
    """A nanoGPT-like model (dropout 0.1, context 512, 6 layers), trained with fused AdamW as nanoGPT does on CUDA."""

    def __init__(self, vocab=8192, ctx=512, dim=384, heads=6, layers=6, dropout=0.1):
        nn.Module.__init__(self)
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.emb_drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(NanoBlock(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight
        self.vocab, self.ctx = vocab, ctx

    def loss(self, idx, targets):
        x = self.emb_drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


SDPA_MODELS["nanogpt"] = NanoGPT
OPTIMIZERS["nanogpt"] = lambda ps: torch.optim.AdamW(ps, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
SDPA_BATCHES["nanogpt"] = (4, 8, 16)


class ClippedAdamW(torch.optim.AdamW):
    """Fused AdamW whose step first clips the gradients' norm to 1.0, as nanoGPT's loop does before each step."""

    def step(self, closure=None):
        torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], 1.0)
        return super().step(closure)


class Encoder(nn.Module):
    """nn.TransformerEncoder as models built from torch.nn use it: pre-norm layers, dropout 0.1, batch first (its
    attention is nn.MultiheadAttention, which calls scaled_dot_product_attention while training), over token
    embeddings, a classifier on the mean."""

    def __init__(self, vocab=8192, ctx=256, dim=384, heads=6, layers=6, classes=1000):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)
        self.vocab, self.ctx, self.classes = vocab, ctx, classes

    def batch(self, n):
        return (torch.randint(0, self.vocab, (n, self.ctx), device="cuda"),
                torch.randint(0, self.classes, (n,), device="cuda"))

    def loss(self, idx, y):
        return F.cross_entropy(self.head(self.encoder(self.emb(idx)).mean(1)), y)


SDPA_MODELS["nanogpt_clip"] = NanoGPT
OPTIMIZERS["nanogpt_clip"] = lambda ps: ClippedAdamW(ps, lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
SDPA_BATCHES["nanogpt_clip"] = (4, 8, 16)
SDPA_MODELS["encoder"] = Encoder
OPTIMIZERS["encoder"] = lambda ps: torch.optim.AdamW(ps, lr=3e-4)
SDPA_BATCHES["encoder"] = (8, 16, 32)
