"""normlab models in plain PyTorch: load what `normlab export RUN --to DIR` wrote.

    import normlab_torch
    model = normlab_torch.load("DIR")            # eval mode, CPU
    logits = model(src, tgt_in)                  # encoder-decoder: [B, T, tgt_vocab]
    logits = model.forward_lm(tokens)            # decoder-only:    [B, T, tgt_vocab]
    tok = normlab_torch.load_tokenizers("DIR")   # tok.encode(text) -> ids, tok.decode(ids) -> text
    normlab_torch.translate(model, tok, "a source sentence", beam=5, lenpen=1.0)   # -> text
    normlab_torch.complete(model, tok, "the start of a line", max_new_tokens=20)   # LM -> text
    normlab_torch.generate(model, ids, beam=1)   # -> Hypothesis(tokens, log_prob, score); ids: a
                                                 # source (encoder-decoder) or a prompt (LM)
A scheme without a PyTorch version here (a third-party plugin): write one as a subclass of Scheme
and `normlab_torch.register_scheme("its-name", TheClass)` before `load` (see register_scheme).

Two model families (config.json "family"; an export without it is "transformer"):
    transformer  fairseq's (Vaswani et al. 2017): ReLU FFN, sinusoidal positions, √d-scaled
                 embeddings, biases on every projection; encoder-decoder or decoder-only.
    llama        LLaMA's (Touvron et al. 2023), decoder-only: SwiGLU FFN, rotary positions on q and k
                 (config "rope_theta", "qk_norm_before_rope"), unscaled embeddings, no biases,
                 "kv_heads" key/value heads (grouped-query attention).

DIR holds model.pt (a state_dict: `torch.load("DIR/model.pt")` is a dict of tensors whose names are
the ones below; `--format hf`: model.safetensors with the same names), config.json (geometry, scheme and its parameters, the spec of every norm, tokenizer)
and the tokenizer model(s). Token ids: 0 pad, 1 unk, 2 bos, 3 eos; a target prefix starts with bos.

Parameter names (`<stack>` is `encoder` or `decoder`; the LM has only `decoder`):
    <stack>.embed_tokens.weight                      [vocab, d] (absent on the decoder when
                                                     share_embeddings = "all": it is the encoder's)
    <stack>.layers.<i>.self_attn.{q,k,v,out}_proj.{weight,bias}   (llama: weight only; k/v_proj
                                                     [kv_heads·d/heads, d])
    decoder.layers.<i>.cross_attn.{q,k,v,out}_proj.{weight,bias}   (encoder-decoder only)
    <stack>.layers.<i>.ffn.fc1.{weight,bias}, ffn.fc2.{weight,bias}   (llama: weight only, and
                                                     ffn.gate.weight [ffn_dim, d])
    <stack>.layers.<i>.<sublayer>_norm.{weight,bias,alpha} and the scheme's own norms and tensors
    <stack>.layers.<i>.{self_attn,cross_attn}.{q,k,v,inner}_norm.*, ffn.inner_norm.*  (norms inside a
                                                     branch: HybridNorm, Magneto, nGPT)
    <stack>.layers.<i>.ffn.{up,gate}_norm.*          on fc1·h and gate·h of a SwiGLU (llama nGPT's s_u, s_ν)
    <stack>.<name>.*                                 a scheme's stack norm (embed_norm, dual_norm)
    <stack>.layer_norm.{weight,bias,alpha}           the stack's final norm, where the scheme has one
    decoder.output_projection.weight                 [tgt_vocab, d] (share_embeddings = "none";
                                                     otherwise the target embedding is the output)
    decoder.logit_scale.weight                       [tgt_vocab], a per-token gain on the logits
                                                     (llama nGPT's s_z)
A norm holds `weight` (γ; ScaleNorm: one scalar g), `bias` (β: LayerNorm, DyT) and `alpha` (DyT's α)
as its kind has them; config.json "norms" gives each norm's spec (kind, eps, affine, bias,
gain_init/gain_scale, out_scale), keyed by its name above.

Plain PyTorch, no normlab import: the forward pass below is normlab's (core/src/model and
plugins/*), written out once per scheme, in eval mode (dropout is the identity).
"""
import json
import math
import os
import struct
import zipfile

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-5
SUBLAYERS_ENC = ("self_attn", "ffn")           # an encoder or LM layer
SUBLAYERS_DEC = ("self_attn", "cross_attn", "ffn")  # a decoder layer of an encoder-decoder model
NORM_KINDS = ("layernorm", "rmsnorm", "scalenorm", "dyt", "l2", "scale", "none")
FAMILIES = ("transformer", "llama")


def sinusoidal_positions(T, d):
    """Vaswani et al. 2017 sec. 3.5 in fairseq's layout: sines then cosines, positions from 0."""
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1)))
    pos = torch.arange(T, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(pos), torch.cos(pos)], 1)
    if d % 2 == 1:
        table = torch.cat([table, torch.zeros(T, 1)], 1)
    return table


def rope_tables(T, dh, theta, like):
    """Rotary positions' cos and sin [T, dh] (RoFormer, Su et al. 2021 eq. 34) in the half-split
    layout of GPT-NeoX / Hugging Face Llama: θ_i = theta^(−2i/dh), angle(t) = cat(t·θ, t·θ),
    computed in float64 and rounded once (core/src/model/attention.cpp rope_tables)."""
    inv_freq = torch.pow(theta, -torch.arange(0, dh, 2, dtype=torch.float64) / dh)
    angles = torch.arange(T, dtype=torch.float64).unsqueeze(1) * inv_freq.unsqueeze(0)
    angles = torch.cat([angles, angles], 1)
    return angles.cos().to(like), angles.sin().to(like)


def apply_rope(x, cos, sin):
    """x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x₂, x₁) over the halves of the last dim."""
    half = x.size(-1) // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def key_padding_mask(tokens, pad_id):
    """Additive mask [B,1,1,T]: -inf where the key is padding."""
    m = torch.zeros(tokens.shape, dtype=torch.float, device=tokens.device)
    if pad_id is not None:  # None: token shards, where every id is a token
        m = m.masked_fill(tokens.eq(pad_id), float("-inf"))
    return m.view(tokens.size(0), 1, 1, tokens.size(1))


def causal_mask(T, device):
    return torch.full((T, T), float("-inf"), device=device).triu(1).view(1, 1, T, T)


class Norm(nn.Module):
    """One norm of the SDK's NormSpec (core/src/model/norm.cpp), over the last dimension `dim`:
        layernorm  γ ⊙ (x − mean) / sqrt(var + ε) + β                 [Ba et al. 2016]
        rmsnorm    γ ⊙ x · rsqrt(mean(x²) + ε), statistics in fp32      [Zhang & Sennrich 2019]
        scalenorm  g · x / max(‖x‖₂, ε), one scalar g                   [Nguyen & Salazar 2019]
        l2         γ ⊙ x / max(‖x‖₂, ε), γ only when affine             [Loshchilov et al. 2025]
        dyt        γ ⊙ tanh(α·x) + β, one scalar α                      [Zhu et al. 2025]
        scale      γ ⊙ x, no statistics (nGPT's s_u, s_ν, s_z)          [Loshchilov et al. 2025]
        none       identity
    A gain stored "scaled" (gain_scale ≠ 0, nGPT) acts as weight · gain_init / gain_scale (ScaleNorm:
    √dim / gain_scale); out_scale multiplies the output (LayerNorm Scaling's 1/√ℓ). q/k norms:
    gain_per_head gives a gain (heads, 1, dim) for x of (B, heads, T, dim) (nGPT's s_qk ∈ ℝ^d), and
    gain_from_query a k norm without a gain of its own: it is called with the q norm's."""

    def __init__(self, spec, dim, heads=0):
        super().__init__()
        kind = spec["kind"]
        if kind not in NORM_KINDS:
            raise ValueError("normlab_torch: norm kind '%s' is unknown (known: %s)" % (kind, ", ".join(NORM_KINDS)))
        self.kind, self.dim = kind, dim
        self.eps, self.out_scale = float(spec["eps"]), float(spec.get("out_scale", 1.0))
        self.gain_factor = 1.0
        self.gain_from_query = bool(spec.get("gain_from_query", False))
        self.per_head = bool(spec.get("gain_per_head", False))
        for name in ("weight", "bias", "alpha"):
            self.register_parameter(name, None)
        if kind == "none":
            return
        gain_scale = float(spec.get("gain_scale", 0.0))
        gain0 = math.sqrt(dim) if kind == "scalenorm" else float(spec.get("gain_init", 1.0))
        if spec["affine"]:
            if gain_scale != 0.0:
                self.gain_factor = gain0 / gain_scale
            shape = (1,) if kind == "scalenorm" else (dim,)
            if spec.get("gain_per_head", False):
                shape = (heads, 1, dim)
            if not spec.get("gain_from_query", False):
                self.weight = nn.Parameter(torch.full(shape, gain_scale if gain_scale != 0.0 else gain0))
        if spec["affine"] and spec["bias"] and kind in ("layernorm", "dyt"):
            self.bias = nn.Parameter(torch.zeros(dim))
        if kind == "dyt":
            self.alpha = nn.Parameter(torch.full((1,), float(spec.get("dyt_alpha0", 0.5))))

    def forward(self, x, weight=None):
        gain = self.weight if weight is None else weight
        if gain is not None and self.gain_factor != 1.0:
            gain = gain * self.gain_factor
        if self.kind == "none":
            return x
        if self.kind == "layernorm":
            if gain is not None and gain.dim() > 1:  # per head: (heads, 1, dim)
                y = F.layer_norm(x, (self.dim,), None, None, self.eps) * gain
                y = y if self.bias is None else y + self.bias
            else:
                y = F.layer_norm(x, (self.dim,), gain, self.bias, self.eps)
        elif self.kind == "rmsnorm":
            xf = x.float()
            y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
            if gain is not None:
                y = y * gain
        elif self.kind in ("scalenorm", "l2"):  # ε clamps the length from below
            y = x / x.norm(2, -1, True).clamp_min(self.eps)
            if gain is not None:
                y = y * gain
        elif self.kind == "scale":
            y = x * gain if gain is not None else x
        else:  # dyt
            y = torch.tanh(self.alpha * x)
            if gain is not None:
                y = y * gain
            if self.bias is not None:
                y = y + self.bias
        if self.out_scale != 1.0:
            y = y * self.out_scale
        return y


class MultiheadAttention(nn.Module):
    """Scaled dot-product attention (Vaswani et al. 2017 sec. 3.2.2), separate q/k/v projections;
    optional norms a scheme places inside: q/k/v per head over head_dim, `inner_norm` over the
    concatenated heads before out_proj. Llama family: no biases, rotary positions on q and k
    (rope_theta > 0; the q/k norms before them when qk_norm_before_rope, else after), and kv_heads
    key/value heads, each serving heads/kv_heads query heads (grouped-query attention).
    Either family (config "qk_norm", "qk_norm_scope", "attn_logit_softcap"): `q_qknorm`/`k_qknorm`
    normalize q and k right after their projections, before RoPE, per head over head_dim ("head",
    Qwen3) or over the whole projection ("all", OLMo 2) (QK-norm: Dehghani et al. 2023, Wortsman et
    al. 2023); a soft-cap s replaces the logits q·kᵀ/√dh by s·tanh(q·kᵀ/(√dh·s)) before the mask
    (Gemma 2)."""

    def __init__(self, d, heads, kv_heads=None, bias=True, rope_theta=0.0, qk_norm_before_rope=False,
                 qk_norm_specs=None, qk_norm_all=False, logit_softcap=0.0):
        super().__init__()
        self.d, self.heads, self.kv_heads = d, heads, kv_heads or heads
        self.rope_theta, self.qk_norm_before_rope = rope_theta, qk_norm_before_rope
        self.qk_norm_all, self.logit_softcap = qk_norm_all, float(logit_softcap)
        kv_dim = self.kv_heads * (d // heads)
        self.q_proj, self.k_proj = nn.Linear(d, d, bias=bias), nn.Linear(d, kv_dim, bias=bias)
        self.v_proj, self.out_proj = nn.Linear(d, kv_dim, bias=bias), nn.Linear(d, d, bias=bias)
        self.q_norm = self.k_norm = self.v_norm = self.inner_norm = None
        self.q_qknorm = self.k_qknorm = None
        if qk_norm_specs is not None:
            dh = d // heads
            self.q_qknorm = Norm(qk_norm_specs[0], d if qk_norm_all else dh)
            self.k_qknorm = Norm(qk_norm_specs[1], kv_dim if qk_norm_all else dh)

    def model_qk_norms(self, q, k):  # q [B, H, T, dh], k [B, Hkv, T, dh]
        if not self.qk_norm_all:
            return self.q_qknorm(q), self.k_qknorm(k)

        def whole(norm, x):
            B, H, T, dh = x.shape
            return norm(x.transpose(1, 2).reshape(B, T, H * dh)).view(B, T, H, dh).transpose(1, 2)

        return whole(self.q_qknorm, q), whole(self.k_qknorm, k)

    def qk_norms(self, q, k):
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k, self.q_norm.weight if self.k_norm.gain_from_query else None)
        return q, k

    def forward(self, query, memory, mask):
        B, Tq, Tk, dh = query.size(0), query.size(1), memory.size(1), self.d // self.heads
        q = self.q_proj(query).view(B, Tq, self.heads, dh).transpose(1, 2)
        k = self.k_proj(memory).view(B, Tk, self.kv_heads, dh).transpose(1, 2)
        v = self.v_proj(memory).view(B, Tk, self.kv_heads, dh).transpose(1, 2)
        if self.q_qknorm is not None:
            q, k = self.model_qk_norms(q, k)
        r = self.heads // self.kv_heads  # kv head j serves q heads j·r … j·r + r − 1 (HF Llama's repeat_kv)
        k_first = r > 1 and self.k_norm is not None and self.k_norm.per_head  # k per q head before its norm
        if k_first:
            k = k.repeat_interleave(r, dim=1)
        norms_first = self.rope_theta <= 0 or self.qk_norm_before_rope
        if norms_first:
            q, k = self.qk_norms(q, k)
        if self.rope_theta > 0:  # self-attention only: query is memory
            cos, sin = rope_tables(Tq, dh, self.rope_theta, q)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if not norms_first:
                q, k = self.qk_norms(q, k)
        if self.v_norm is not None:
            v = self.v_norm(v)
        if r > 1:
            k = k if k_first else k.repeat_interleave(r, dim=1)
            v = v.repeat_interleave(r, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh)
        if self.logit_softcap > 0:
            scores = torch.tanh(scores / self.logit_softcap) * self.logit_softcap
        if mask is not None:
            scores = scores + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(B, Tq, self.d)
        if self.inner_norm is not None:
            ctx = self.inner_norm(ctx)
        return self.out_proj(ctx)


class FeedForward(nn.Module):
    """FFN(h) = W2 · ReLU(W1 · h) (Vaswani et al. 2017 sec. 3.3); gated (llama): SwiGLU,
    FFN(h) = W2 · (SiLU(W_gate · h) ⊙ W1 · h) (Shazeer 2020, "GLU Variants Improve Transformer",
    eq. 6; `gate` is its W, fc1 its V); `inner_norm` on the activation; in a SwiGLU, `up_norm` on
    fc1·h and `gate_norm` on gate·h before its SiLU."""

    def __init__(self, d, ffn_dim, gated=False, bias=True):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, ffn_dim, bias=bias), nn.Linear(ffn_dim, d, bias=bias)
        self.gate = nn.Linear(d, ffn_dim, bias=bias) if gated else None
        self.inner_norm = self.up_norm = self.gate_norm = None

    def forward(self, h):
        if self.gate is not None:
            g, u = self.gate(h), self.fc1(h)
            if self.gate_norm is not None:
                g = self.gate_norm(g)
            if self.up_norm is not None:
                u = self.up_norm(u)
            a = F.silu(g) * u
        else:
            a = torch.relu(self.fc1(h))
        if self.inner_norm is not None:
            a = self.inner_norm(a)
        return self.fc2(a)


# ---- schemes ------------------------------------------------------------------------------------
# Each scheme declares what it adds to a layer (norms, norms inside a branch, learnable tensors) and
# to a stack (norms, the final norm), and wires one layer: forward(layer, x, branch), or
# forward_streams(layer, streams, branch) for several residual streams, where branch(name, h) runs
# sublayer `name` on h and layer.norm / layer.param reach its norms and tensors. `layer` knows its
# stack, index, stack_layers, sublayers and d. Equations as in docs/schemes/<folder>.md and
# each plugin's source (plugins/<scheme>/<scheme>.cpp), whose citation each docstring repeats.


class Scheme:
    def __init__(self, cfg):
        self.cfg = cfg
        self.params = cfg["scheme"].get("params", {})

    def layer_norms(self, layer):  # names of norms over d_model
        return [s + "_norm" for s in layer.sublayers]

    def wide_layer_norms(self, layer):  # name -> dim, for norms over other than d_model features
        return {}

    def branch_norms(self, layer):  # (sublayer, "q_norm" | "k_norm" | "v_norm" | "inner_norm" | "up_norm" | "gate_norm")
        return []

    def layer_params(self, layer):  # name -> shape
        return {}

    def stack_norms(self, stack):  # names of norms on the stack, over d_model
        return []

    def stack_params(self, stack):  # name -> shape, parameters on the stack (`<stack>.<name>`)
        return {}

    def final_norm(self, stack):  # the stack ends with the norm `<stack>.layer_norm`
        return False

    def logit_scale(self):
        """Whether the logits are s ⊙ (W_out h), s the kind-"scale" norm `decoder.logit_scale` over the
        vocabulary (the SDK's Scheme::logit_scale); by default as config.json "norms" has it or not."""
        return "decoder.logit_scale" in self.cfg.get("norms", {})

    def begin(self, stack, x):  # the embedded input -> the streams every layer passes on
        return [x]

    def end(self, stack, streams):
        return streams[0]

    def forward_streams(self, layer, streams, branch):
        return [self.forward(layer, streams[0], branch)]

    def forward(self, layer, x, branch):
        raise NotImplementedError


class PostLN(Scheme):
    """Post-LN, Vaswani et al. 2017 sec. 3.1 (B2T paper eq. (1)): y = LN(x + F(x)) per sublayer.
    Also post-ln-init (DeepNet sec. II, Fig. 2) and ds-init (Zhang et al. 2019 eq. 9): they change
    only the initialization, not the forward pass."""

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = layer.norm(s + "_norm", x + branch(s, x))
        return x


class PreLN(Scheme):
    """Pre-LN, Xiong et al. 2020 (B2T paper eq. (2)): y = x + F(LN(x)); a final LN per stack."""

    def final_norm(self, stack):
        return True

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + branch(s, layer.norm(s + "_norm", x))
        return x


class DyT(PreLN):
    """DyT, Zhu et al. 2025 ("Transformers without Normalization"): Pre-LN with every norm a Dynamic
    Tanh, y = x + F(DyT(x)), DyT(x) = γ ⊙ tanh(α·x) + β, final DyT per stack. The α₀ of each
    norm (alpha0, alpha0_attn/ffn/final) is its initial value, held by the exported `alpha`.
    Llama family (the authors' LLaMA code): no β (config.json "norms"), and the embedded input times
    a learned scalar `decoder.embed_scale` (init √d)."""

    def stack_params(self, stack):
        return {"embed_scale": (1,)} if family(self.cfg) == "llama" else {}

    def begin(self, stack, x):
        return [x * stack.embed_scale] if family(self.cfg) == "llama" else [x]


class LNScaling(PreLN):
    """LayerNorm Scaling, Sun et al. 2025 ("The Curse of Depth in Large Language Models"):
    y = x + F(Norm(x)/√ℓ), ℓ the 1-based layer index in its stack; final Norm unscaled. The factor
    1/√ℓ is each in-layer norm's out_scale (config.json "norms")."""


def deepnorm_alpha(cfg, stack):
    """DeepNet (Wang et al. 2022) sec. III-C / Theorem 3: α per architecture and stack (the skip
    weight; torchscale_compat changes only β, i.e. the initialization)."""
    N, M = cfg["enc_layers"], cfg["dec_layers"]
    if cfg["arch"] == "lm":
        return (2.0 * M) ** 0.25                        # decoder-only: (2M)^(1/4)
    if stack == "encoder":
        return 0.81 * (float(N) ** 4 * M) ** (1.0 / 16)  # 0.81·(N⁴M)^(1/16)
    return (3.0 * M) ** 0.25                            # encoder-decoder decoder: (3M)^(1/4)


class DeepNorm(Scheme):
    """DeepNorm, DeepNet sec. III-A eq. x_{l+1} = LN(α·x_l + G_l(x_l)): α scales the skip."""

    def forward(self, layer, x, branch):
        alpha = deepnorm_alpha(self.cfg, layer.stack)
        for s in layer.sublayers:
            x = layer.norm(s + "_norm", x * alpha + branch(s, x))
        return x


def branchnorm_alpha(schedule, t, T, k, alpha_min):
    """BranchNorm's α_t, clipped to 1 (Liu et al. 2023 Fig. 5). `linear` is the paper's eq. (8),
    α_t = min(1, t/T); `exp` and `sigmoid` are normlab's own (the paper shows only a figure)."""
    if t >= T:
        a = 1.0
    else:
        u = max(t, 0.0) / T
        if schedule == "exp":
            a = math.expm1(k * u) / math.expm1(k)
        elif schedule == "sigmoid":
            sig = lambda z: 1.0 / (1.0 + math.exp(-z))
            lo, hi = sig(-k / 2), sig(k / 2)
            a = (sig(k * (u - 0.5)) - lo) / (hi - lo)
        else:
            a = u
    return max(alpha_min, a)


class BranchNorm(Scheme):
    """BranchNorm, Liu et al. 2023 sec. 4.2 eq. (7): y = LN(x + α_t·F(x)), α_t on the branch.
    normlab's forward for update u = updates_done + 1 uses α_u (plugins/branchnorm), so a model
    restored from a checkpoint with updates_done = n computes with α_{n+1}."""

    def alpha(self):
        p = self.params
        t = float(self.cfg["scheme"].get("state", {}).get("updates_done", 0) + 1)
        return branchnorm_alpha(p.get("schedule", "linear"), t, float(p.get("T", 4000)),
                                float(p.get("k", 5.0)), float(p.get("alpha_min", 0.0)))

    def forward(self, layer, x, branch):
        a = self.alpha()
        for s in layer.sublayers:
            x = layer.norm(s + "_norm", x + branch(s, x) * a)
        return x


class B2T(Scheme):
    """B2T connection, Takase et al. 2023 sec. 5 eq. (5): Post-LN sublayers, and the layer
    input x added before the last LayerNorm: y = LN_f(h + FFN(h) + x) (no scale, no dropout)."""

    def forward(self, layer, x, branch):
        h = x
        for s in layer.sublayers[:-1]:
            h = layer.norm(s + "_norm", h + branch(s, h))
        return layer.norm("ffn_norm", h + branch("ffn", h) + x)


class Admin(Scheme):
    """Admin, Liu et al. 2020 ("Understanding the Difficulty of Training Transformers";
    docs/schemes/admin.md):
    y = LN(ω_i ⊙ x + F(x)), ω_i ∈ R^d learnable per sublayer (tensor `<sublayer>_omega`); the
    profiling pass only sets ω's initial value, which the exported weights already hold."""

    def layer_params(self, layer):
        return {s + "_omega": (layer.d,) for s in layer.sublayers}

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = layer.norm(s + "_norm", layer.param(s + "_omega") * x + branch(s, x))
        return x


class ReZero(Scheme):
    """ReZero, Bachlechner et al. 2021 ("ReZero is All You Need"): y = x + g·F(x), one learnable scalar gate g per
    sublayer (tensor `<sublayer>_gate`, shape [1]), no LayerNorm."""

    def layer_norms(self, layer):
        return []

    def layer_params(self, layer):
        return {s + "_gate": (1,) for s in layer.sublayers}

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + layer.param(s + "_gate") * branch(s, x)
        return x


class SandwichLN(Scheme):
    """Sandwich-LN, Ding et al. 2021 (CogView) sec. 2.4: y = x + LN_out(F(LN_in(x))) with
    LN_in = `<sublayer>_norm`, LN_out = `<sublayer>_out_norm`; a final LN per stack."""

    def layer_norms(self, layer):
        return [n for s in layer.sublayers for n in (s + "_norm", s + "_out_norm")]

    def final_norm(self, stack):
        return True

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + layer.norm(s + "_out_norm", branch(s, layer.norm(s + "_norm", x)))
        return x


class PeriLN(SandwichLN):
    """Peri-LN, Kim et al. 2025 (ICML 2025): y = x + Norm_out(F(Norm_in(x))) per sublayer, final Norm
    per stack (Sandwich-LN's layers); `embedding_norm` adds h₀ = Norm(embedding) (`<stack>.embed_norm`)."""

    def stack_norms(self, stack):
        return ["embed_norm"] if self.params.get("embedding_norm", False) else []

    def begin(self, stack, x):
        return [stack.norm("embed_norm", x)] if self.params.get("embedding_norm", False) else [x]


class ReorderedNorm(Scheme):
    """Reordered norm, OLMo 2 (Team OLMo 2024, "2 OLMo 2 Furious", sec. 3.2; OLMo-core's
    ReorderedNormTransformerBlock): y = x + Norm(F(x)) per sublayer, Norm = `<sublayer>_out_norm`, no
    input norm; a final Norm per stack."""

    def layer_norms(self, layer):
        return [s + "_out_norm" for s in layer.sublayers]

    def final_norm(self, stack):
        return True

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + layer.norm(s + "_out_norm", branch(s, x))
        return x


class HybridNorm(Scheme):
    """HybridNorm, Zhuo et al. 2025: QKV-norm in attention (no input norm), Post-Norm FFN, final norm:
        a = x + Attn(Norm(Q), Norm(K), Norm(V));  n = Norm_ffn(a);  y = n + FFN(n)
    q/k/v norms per head over head_dim. `first_layer_prenorm` (HybridNorm*): layer 1 of each stack is
    Pre-Norm in every sublayer, QKV-norm kept."""

    def prenorm(self, layer):
        return bool(self.params.get("first_layer_prenorm", False)) and layer.index == 0

    def layer_norms(self, layer):
        return [s + "_norm" for s in layer.sublayers if self.prenorm(layer) or s == "ffn"]

    def branch_norms(self, layer):
        return [(s, p) for s in layer.sublayers if s != "ffn" for p in ("q_norm", "k_norm", "v_norm")]

    def final_norm(self, stack):
        return True

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            if self.prenorm(layer):
                x = x + branch(s, layer.norm(s + "_norm", x))
            elif s != "ffn":
                x = x + branch(s, x)
            else:
                n = layer.norm("ffn_norm", x)
                x = n + branch(s, n)
        return x


class Magneto(PreLN):
    """Magneto / Sub-LN, Wang et al. 2022 ("Foundation Transformers"): Pre-LN plus a norm before each
    branch's output projection: SA y = x + W_O·Norm(Attn(Norm(x))), FFN y = x + W_2·Norm(ReLU(W_1·Norm(x)));
    CA plain Pre-LN unless `cross_attn_subln`; final Norm. γ changes only the initialization."""

    def branch_norms(self, layer):
        out = [("self_attn", "inner_norm"), ("ffn", "inner_norm")]
        if self.params.get("cross_attn_subln", False) and "cross_attn" in layer.sublayers:
            out.append(("cross_attn", "inner_norm"))
        return out


def mix_ln_post_layers(alpha, layers):
    """Mix-LN's k = ⌊α·L⌋ (the small epsilon keeps e.g. 0.25·12 = 3 from flooring to 2)."""
    return int(math.floor(alpha * layers + 1e-9))


class MixLN(Scheme):
    """Mix-LN, Li et al. 2025 (ICLR 2025): Post-LN in the first ⌊α·L⌋ layers of a stack, Pre-LN above,
    final Norm: ℓ ≤ k: y = Norm(x + F(x)); ℓ > k: y = x + F(Norm(x))."""

    def final_norm(self, stack):
        return True

    def forward(self, layer, x, branch):
        post = layer.index < mix_ln_post_layers(float(self.params.get("alpha", 0.25)), layer.stack_layers)
        for s in layer.sublayers:
            if post:
                x = layer.norm(s + "_norm", x + branch(s, x))
            else:
                x = x + branch(s, layer.norm(s + "_norm", x))
        return x


class ResiDual(Scheme):
    """ResiDual, Xie et al. 2023 sec. 3: a Post-LN stream x_a and a dual stream x_d, both from e:
    o = F(x_a); x_d ← x_d + o; x_a ← LN(x_a + o) per sublayer; out = x_a + LN_final(x_d)
    (`<stack>.dual_norm`, ε final_ln_eps); no other final norm."""

    def stack_norms(self, stack):
        return ["dual_norm"]

    def begin(self, stack, x):
        return [x, x]

    def end(self, stack, streams):
        return streams[0] + stack.norm("dual_norm", streams[1])

    def forward_streams(self, layer, streams, branch):
        xa, xd = streams
        for s in layer.sublayers:
            o = branch(s, xa)
            xd = xd + o
            xa = layer.norm(s + "_norm", xa + o)
        return [xa, xd]


NGPT_ALPHA0 = 0.05  # nGPT's eigen learning rate α at init (plugins/ngpt: kAlpha0)


class NGPT(Scheme):
    """nGPT, Loshchilov et al. ICLR 2025, sec. 2.2-2.6: Norm = x/‖x‖₂ (L2), per sublayer
        h ← Norm(h + α ⊙ (Norm(F(h)) − h)),  α = stored `<sublayer>_alpha` · 0.05·√d,
    q and k L2-normed per head with scaled gains (the q norm's out_scale d_k turns the core's
    1/√d_k into √d_k); h₀ = Norm(embedding) (`<stack>.embed_norm`); the decoder's final norm is a
    scaled-gain L2 (the logit scale), the encoder has none. Llama family (sec. 2.4.2, 2.5): SwiGLU
    with u = s_u ⊙ (W_u h) (`ffn.up_norm`) and ν = s_ν ⊙ (W_ν h)·√d (`ffn.gate_norm`, out_scale √d),
    logits z = s_z ⊙ (E_out h) (`decoder.logit_scale`), no final norm."""

    def llama(self):
        return family(self.cfg) == "llama"

    def layer_norms(self, layer):
        return [n for s in layer.sublayers for n in (s + "_out_norm", s + "_norm")]

    def branch_norms(self, layer):
        out = [(s, p) for s in layer.sublayers if s != "ffn" for p in ("q_norm", "k_norm")]
        return out + ([("ffn", "up_norm"), ("ffn", "gate_norm")] if self.llama() else [])

    def layer_params(self, layer):
        return {s + "_alpha": (layer.d,) for s in layer.sublayers}

    def stack_norms(self, stack):
        return ["embed_norm"]

    def final_norm(self, stack):
        return stack.name == "decoder" and not self.llama()

    def logit_scale(self):
        return self.llama()

    def begin(self, stack, x):
        return [stack.norm("embed_norm", x)]

    def forward(self, layer, x, branch):
        alpha_scale = 1.0 / math.sqrt(layer.d)
        h = x
        for s in layer.sublayers:
            alpha = layer.param(s + "_alpha") * (NGPT_ALPHA0 / alpha_scale)
            h_f = layer.norm(s + "_out_norm", branch(s, h))
            h = layer.norm(s + "_norm", h + alpha * (h_f - h))
        return h


class HyperConnections(Scheme):
    """Hyper-Connections, Zhu et al. ICLR 2025 sec. 2.1-2.3: n streams H_1..H_n (copies of the
    embedded input), per sublayer (tensors `<sublayer>_hc_{am,ar,b}`):
        h_in = Σ_i A_m[i] H_i;  t = F(Norm(h_in));  H_j ← Σ_i A_r[i,j] H_i + B[j] t
    dynamic (DHC, sec. 2.2), with H̄ = Norm_hc(H) per stream (`<sublayer>_hc_norm`):
        A_m += s_α tanh(H̄ W_m), A_r += s_α tanh(H̄ W_r), B += s_β tanh(H̄ W_β);
    end of the stack: the sum of the streams, then the final norm."""

    def n(self):
        return int(self.params.get("n", 4))

    def dynamic(self):
        return bool(self.params.get("dynamic", self.cfg["scheme"]["name"] == "hyper-connections-dynamic"))

    def layer_norms(self, layer):
        names = [s + "_norm" for s in layer.sublayers]
        if self.dynamic():
            names += [s + "_hc_norm" for s in layer.sublayers]
        return names

    def layer_params(self, layer):
        n, d, out = self.n(), layer.d, {}
        for s in layer.sublayers:
            p = s + "_hc_"
            out.update({p + "am": (n,), p + "ar": (n, n), p + "b": (n,)})
            if self.dynamic():
                out.update({p + "wm": (d,), p + "wr": (d, n), p + "wb": (d,), p + "s_alpha": (1,), p + "s_beta": (1,)})
        return out

    def final_norm(self, stack):
        return True

    def begin(self, stack, x):
        return [x] * self.n()

    def end(self, stack, streams):
        return torch.stack(streams, 0).sum(0)

    def forward_streams(self, layer, streams, branch):
        for s in layer.sublayers:
            p = s + "_hc_"
            H = torch.stack(streams, -2)  # [B, T, n, d]
            am, ar, b = layer.param(p + "am"), layer.param(p + "ar"), layer.param(p + "b")
            if self.dynamic():
                Hn = torch.stack([layer.norm(p + "norm", h) for h in streams], -2)
                am = am + layer.param(p + "s_alpha") * torch.tanh(torch.matmul(Hn, layer.param(p + "wm")))
                ar = ar + layer.param(p + "s_alpha") * torch.tanh(torch.matmul(Hn, layer.param(p + "wr")))
                b = b + layer.param(p + "s_beta") * torch.tanh(torch.matmul(Hn, layer.param(p + "wb")))
            h_in = (am.unsqueeze(-1) * H).sum(-2)
            t = branch(s, layer.norm(s + "_norm", h_in))
            out = torch.matmul(ar.transpose(-1, -2), H) + b.unsqueeze(-1) * t.unsqueeze(-2)
            streams = list(out.unbind(-2))
        return streams


def sinkhorn_knopp(logits, iterations):
    """mHC's Sinkhorn-Knopp (plugins/mhc/sinkhorn.h): exp (less the per-matrix maximum), then rows
    and columns normalized in turn, `iterations` times, over the last two dims."""
    m = torch.exp(logits - logits.flatten(-2).max(-1, keepdim=True)[0].unsqueeze(-1))
    for _ in range(iterations):
        m = m / m.sum(-1, keepdim=True)
        m = m / m.sum(-2, keepdim=True)
    return m


class MHC(HyperConnections):
    """mHC, Xie et al. 2025 eqs. 7-9, Table 5: hyper-connections whose mixing comes from
    x̃ = RMSNorm(vec(x_l)) (`<sublayer>_mhc_norm`, over n·d):
        H_pre = σ(α_pre x̃φ_pre + b_pre), H_post = 2σ(α_post x̃φ_post + b_post),
        H_res = SinkhornKnopp(α_res mat(x̃φ_res) + b_res)   (t_max iterations)
        x_{l+1} = H_res x_l + H_postᵀ F(Norm(H_pre x_l));  end: sum of the streams, final norm."""

    def dynamic(self):
        return False

    def layer_norms(self, layer):
        return [s + "_norm" for s in layer.sublayers]

    def wide_layer_norms(self, layer):  # x̃'s RMSNorm, over n·d
        return {s + "_mhc_norm": self.n() * layer.d for s in layer.sublayers}

    def layer_params(self, layer):
        n, nc, out = self.n(), self.n() * layer.d, {}
        for s in layer.sublayers:
            p = s + "_mhc_"
            out.update({p + "phi_pre": (nc, n), p + "phi_post": (nc, n), p + "phi_res": (nc, n * n),
                        p + "b_pre": (n,), p + "b_post": (n,), p + "b_res": (n, n),
                        p + "alpha_pre": (1,), p + "alpha_post": (1,), p + "alpha_res": (1,)})
        return out

    def forward_streams(self, layer, streams, branch):
        n, t_max = self.n(), int(self.params.get("t_max", 20))
        for s in layer.sublayers:
            p = s + "_mhc_"
            P = lambda name: layer.param(p + name)  # noqa: E731
            x = torch.stack(streams, -2)  # [B, T, n, C]
            xt = layer.norm(p + "norm", x.flatten(-2))
            pre = torch.sigmoid(P("alpha_pre") * torch.matmul(xt, P("phi_pre")) + P("b_pre"))
            post = 2.0 * torch.sigmoid(P("alpha_post") * torch.matmul(xt, P("phi_post")) + P("b_post"))
            square = list(x.shape[:-1]) + [n]
            res_logits = P("alpha_res") * torch.matmul(xt, P("phi_res")).reshape(square) + P("b_res")
            h_res = sinkhorn_knopp(res_logits, t_max)
            h_in = (pre.unsqueeze(-1) * x).sum(-2)
            t = branch(s, layer.norm(s + "_norm", h_in))
            streams = list((torch.matmul(h_res, x) + post.unsqueeze(-1) * t.unsqueeze(-2)).unbind(-2))
        return streams


SCHEMES = {
    "post-ln": PostLN,
    "post-ln-init": PostLN,
    "ds-init": PostLN,
    "pre-ln": PreLN,
    "deepnorm": DeepNorm,
    "branchnorm": BranchNorm,
    "b2t": B2T,
    "admin": Admin,
    "rezero": ReZero,
    "sandwich-ln": SandwichLN,
    "peri-ln": PeriLN,
    "reordered-norm": ReorderedNorm,
    "dyt": DyT,
    "ln-scaling": LNScaling,
    "hybridnorm": HybridNorm,
    "magneto": Magneto,
    "mix-ln": MixLN,
    "residual": ResiDual,
    "ngpt": NGPT,
    "hyper-connections": HyperConnections,
    "hyper-connections-dynamic": HyperConnections,
    "mhc": MHC,
}
# Exports of format_version 1 name no norm specs: only these schemes, with LayerNorms, can be rebuilt.
FORMAT1_SCHEMES = ("post-ln", "post-ln-init", "ds-init", "pre-ln", "deepnorm", "branchnorm", "b2t",
                   "admin", "rezero", "sandwich-ln")


def register_scheme(name, cls, replace=False):
    """Makes `load` rebuild exports of scheme `name` (config.json scheme.name, the name its plugin
    registers in normlab) with `cls`, a subclass of Scheme. Built with config.json as a dict (its
    parameters in self.params), the class declares the scheme's norms and tensors (layer_norms,
    wide_layer_norms, branch_norms, layer_params, stack_norms, final_norm, logit_scale) and wires one
    layer (forward, or forward_streams with begin/end for several residual streams), as the classes
    above do for the built-in schemes; its names must be the plugin's parameter names in the
    state_dict (config.json "norms" gives each norm's spec). Call it before `load`."""
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise TypeError("normlab_torch.register_scheme: %r is not a subclass of normlab_torch.Scheme" % (cls,))
    if name in SCHEMES and not replace and SCHEMES[name] is not cls:
        raise ValueError("normlab_torch.register_scheme: '%s' is registered already (replace=True replaces it)" % name)
    SCHEMES[name] = cls


def make_scheme(cfg):
    name = cfg["scheme"]["name"]
    if name not in SCHEMES:
        raise ValueError("normlab_torch: scheme '%s' has no PyTorch version here (known: %s). For a third-party "
                         "scheme, write its forward pass as a subclass of normlab_torch.Scheme and call "
                         "normlab_torch.register_scheme('%s', YourScheme) before load (see register_scheme's "
                         "docstring and docs/export.md)" % (name, ", ".join(sorted(SCHEMES)), name))
    if "norms" not in cfg:  # format_version 1
        if cfg.get("norm", "layernorm") != "layernorm":
            raise ValueError("normlab_torch: norm kind '%s' (scheme.norm) needs an export with the norm specs "
                             "(format_version 2): export the run again" % cfg["norm"])
        if name not in FORMAT1_SCHEMES:
            raise ValueError("normlab_torch: scheme '%s' needs an export with the norm specs (format_version 2): "
                             "export the run again" % name)
    return SCHEMES[name](cfg)


def family(cfg):
    """config.json "family"; exports older than the llama family name none: "transformer"."""
    name = cfg.get("family", "transformer")
    if name not in FAMILIES:
        raise ValueError("normlab_torch: model family '%s' is unknown (known: %s)" % (name, ", ".join(FAMILIES)))
    if name == "llama" and cfg["arch"] != "lm":
        raise ValueError("normlab_torch: the llama family is decoder-only (arch \"lm\"), got arch \"%s\"" % cfg["arch"])
    return name


def norm_spec(cfg, name):
    """The spec of norm `name` (its state_dict prefix) as config.json gives it."""
    if "norms" not in cfg:  # format_version 1: every norm a LayerNorm of the manifest's eps
        return {"kind": "layernorm", "eps": cfg.get("layer_norm_eps", LAYER_NORM_EPS), "affine": True, "bias": True}
    if name not in cfg["norms"]:
        raise ValueError("normlab_torch: config.json \"norms\" has no '%s', which scheme '%s' places"
                         % (name, cfg["scheme"]["name"]))
    return cfg["norms"][name]


# ---- the model ----------------------------------------------------------------------------------


class Layer(nn.Module):
    def __init__(self, cfg, scheme, stack, index, sublayers):
        super().__init__()
        d = cfg["d_model"]
        self.scheme, self.stack, self.index, self.sublayers, self.d = scheme, stack, index, sublayers, d
        self.stack_layers = cfg["enc_layers"] if stack == "encoder" else cfg["dec_layers"]
        prefix = "%s.layers.%d." % (stack, index)

        def interventions(s):  # issue 67.1's keys, absent (off) in older exports
            on = cfg.get("qk_norm", "none") != "none"
            specs = (norm_spec(cfg, prefix + s + ".q_qknorm"), norm_spec(cfg, prefix + s + ".k_qknorm")) if on else None
            return {"qk_norm_specs": specs, "qk_norm_all": cfg.get("qk_norm_scope", "head") == "all",
                    "logit_softcap": float(cfg.get("attn_logit_softcap", 0.0))}

        if family(cfg) == "llama":
            self.self_attn = MultiheadAttention(d, cfg["heads"], cfg["kv_heads"], bias=False,
                                                rope_theta=float(cfg["rope_theta"]),
                                                qk_norm_before_rope=bool(cfg["qk_norm_before_rope"]),
                                                **interventions("self_attn"))
            self.ffn = FeedForward(d, cfg["ffn_dim"], gated=True, bias=False)
        else:
            self.self_attn = MultiheadAttention(d, cfg["heads"], **interventions("self_attn"))
            if "cross_attn" in sublayers:
                self.cross_attn = MultiheadAttention(d, cfg["heads"], **interventions("cross_attn"))
            self.ffn = FeedForward(d, cfg["ffn_dim"])
        for name in scheme.layer_norms(self):
            setattr(self, name, Norm(norm_spec(cfg, prefix + name), d))
        for name, dim in scheme.wide_layer_norms(self).items():
            setattr(self, name, Norm(norm_spec(cfg, prefix + name), dim))
        dims = {"q_norm": d // cfg["heads"], "k_norm": d // cfg["heads"], "v_norm": d // cfg["heads"],
                "inner_norm": cfg["ffn_dim"], "up_norm": cfg["ffn_dim"], "gate_norm": cfg["ffn_dim"]}
        for s, point in scheme.branch_norms(self):
            if point in ("up_norm", "gate_norm") and (s != "ffn" or self.ffn.gate is None):
                raise ValueError("normlab_torch: a norm at %s.%s needs a gated FFN (family llama)" % (s, point))
            dim = d if (point == "inner_norm" and s != "ffn") else dims[point]
            setattr(getattr(self, s), point, Norm(norm_spec(cfg, "%s%s.%s" % (prefix, s, point)), dim, cfg["heads"]))
        for name, shape in scheme.layer_params(self).items():
            setattr(self, name, nn.Parameter(torch.ones(shape)))

    def norm(self, name, x):
        return getattr(self, name)(x)

    def param(self, name):
        return getattr(self, name)

    def forward(self, streams, self_mask, memory=None, memory_mask=None):
        def branch(s, h):
            if s == "self_attn":
                return self.self_attn(h, h, self_mask)
            if s == "cross_attn":
                return self.cross_attn(h, memory, memory_mask)
            return self.ffn(h)

        return self.scheme.forward_streams(self, streams, branch)


class Stack(nn.Module):
    def __init__(self, cfg, scheme, stack, embed, owns_embedding):
        super().__init__()
        d = cfg["d_model"]
        self.d, self.name, self.scheme = d, stack, scheme
        # The transformer family scales the embedding by √d and adds sinusoidal positions; llama
        # does neither (its positions are the rotary ones inside self-attention).
        self.absolute_positions = family(cfg) == "transformer"
        if owns_embedding:
            self.embed_tokens = embed
        else:  # shared with the encoder: not registered twice (the state_dict names it once)
            self._shared = [embed]
        sublayers = SUBLAYERS_DEC if (stack == "decoder" and cfg["arch"] == "encdec") else SUBLAYERS_ENC
        n = cfg["enc_layers"] if stack == "encoder" else cfg["dec_layers"]
        self.layers = nn.ModuleList(Layer(cfg, scheme, stack, i, sublayers) for i in range(n))
        for name in scheme.stack_norms(self):
            setattr(self, name, Norm(norm_spec(cfg, "%s.%s" % (stack, name)), d))
        for name, shape in scheme.stack_params(self).items():
            setattr(self, name, nn.Parameter(torch.ones(shape)))
        if scheme.final_norm(self):
            final = "%s.layer_norm" % stack
            # A final norm of kind none is not a module in normlab (and not in config.json "norms").
            if "norms" not in cfg or final in cfg["norms"] or cfg.get("norm") != "none":
                self.layer_norm = Norm(norm_spec(cfg, final), d)

    @property
    def embedding(self):
        return self.embed_tokens if "embed_tokens" in self._modules else self._shared[0]

    def norm(self, name, x):
        return getattr(self, name)(x)

    def forward(self, tokens, self_mask, memory=None, memory_mask=None):
        x = self.embedding(tokens)
        if self.absolute_positions:
            x = x * math.sqrt(self.d) + sinusoidal_positions(tokens.size(1), self.d).to(x).unsqueeze(0)
        streams = self.scheme.begin(self, x)
        for layer in self.layers:
            streams = layer(streams, self_mask, memory, memory_mask)
        x = self.scheme.end(self, streams)
        if hasattr(self, "layer_norm"):
            x = self.layer_norm(x)
        return x


class NormlabTransformer(nn.Module):
    """The encoder-decoder (translation) or decoder-only (LM) Transformer of an export's config,
    of either family (the llama family is decoder-only)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg, self.family = cfg, family(cfg)
        self.scheme = make_scheme(cfg)
        d, pad = cfg["d_model"], cfg["special_ids"]["pad"]
        self.pad_id = pad
        sharing = cfg["share_embeddings"]
        tgt_embed = nn.Embedding(cfg["tgt_vocab"], d, padding_idx=pad)  # pad None: no padding row
        if cfg["arch"] == "encdec":
            shared = sharing == "all"
            src_embed = tgt_embed if shared else nn.Embedding(cfg["src_vocab"], d, padding_idx=pad)
            self.encoder = Stack(cfg, self.scheme, "encoder", src_embed, True)
            self.decoder = Stack(cfg, self.scheme, "decoder", tgt_embed, not shared)
        else:
            self.encoder = None
            self.decoder = Stack(cfg, self.scheme, "decoder", tgt_embed, True)
        if sharing == "none":
            self.decoder.output_projection = nn.Linear(d, cfg["tgt_vocab"], bias=False)
        if self.scheme.logit_scale():
            spec = norm_spec(cfg, "decoder.logit_scale")
            if spec["kind"] != "scale":  # as TransformerModelImpl's check
                raise ValueError("normlab_torch: decoder.logit_scale is of kind '%s'; a logit scale is of kind 'scale'"
                                 % spec["kind"])
            self.decoder.logit_scale = Norm(spec, cfg["tgt_vocab"])

    def output_logits(self, hidden):
        if hasattr(self.decoder, "output_projection"):
            weight = self.decoder.output_projection.weight
        else:
            weight = self.decoder.embedding.weight
        if hasattr(self.decoder, "logit_scale"):  # z = s ⊙ (W h) = (diag(s) W) h, as normlab computes it
            weight = self.decoder.logit_scale(weight.t()).t()
        logits = F.linear(hidden, weight)
        cap = float(self.cfg.get("final_logit_softcap", 0.0))
        if cap > 0:  # Gemma 2's final soft-cap s·tanh(z/s)
            logits = torch.tanh(logits / cap) * cap
        return logits

    def encode(self, src):
        mask = key_padding_mask(src, self.pad_id)
        return self.encoder(src, mask), mask

    def decode(self, tgt_in, memory, memory_mask):
        mask = causal_mask(tgt_in.size(1), tgt_in.device) + key_padding_mask(tgt_in, self.pad_id)
        return self.output_logits(self.decoder(tgt_in, mask, memory, memory_mask))

    def forward(self, src, tgt_in):
        """Encoder-decoder: logits [B, T, tgt_vocab] of the target prefix tgt_in given src."""
        if self.encoder is None:
            raise ValueError("forward(src, tgt_in) needs an encoder-decoder model; use forward_lm")
        memory, memory_mask = self.encode(src)
        return self.decode(tgt_in, memory, memory_mask)

    def forward_lm(self, tokens):
        """Decoder-only: causal logits [B, T, tgt_vocab]."""
        if self.encoder is not None:
            raise ValueError("forward_lm(tokens) needs a decoder-only model; use forward")
        mask = causal_mask(tokens.size(1), tokens.device) + key_padding_mask(tokens, self.pad_id)
        return self.output_logits(self.decoder(tokens, mask))


SAFETENSORS_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "BOOL": torch.bool}
WEIGHTS_EXPECTED = ("expected what `normlab export` writes: model.pt (a zip as torch.save writes it, of one "
                    "dict name -> tensor) or model.safetensors")


def _not_weights(path, why):
    # Refused, never handed to torch.load / torch.jit.load / pickle: an export folder may come from anyone.
    return ValueError("normlab_torch: %s: %s; %s" % (path, why, WEIGHTS_EXPECTED))


def _tensor_of(data, dtype):  # a copy: torch.frombuffer of read-only bytes warns, of no bytes fails
    return torch.frombuffer(bytearray(data), dtype=dtype) if len(data) else torch.empty(0, dtype=dtype)


def read_safetensors(path):
    """A safetensors file as a dict name -> tensor, read by its spec (huggingface/safetensors,
    "Format"): an 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape,
    data_offsets}} (and "__metadata__"), then the tensors' little-endian bytes back to back."""
    with open(path, "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    if len(blob) < 8 or 8 + n > len(blob):
        raise _not_weights(path, "not a safetensors file (a header of %d bytes in a file of %d)" % (n, len(blob)))
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
        data = memoryview(blob)[8 + n:]
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError("tensor %s has dtype %s (known: %s)"
                                 % (name, info["dtype"], ", ".join(SAFETENSORS_DTYPES)))
            begin, end = info["data_offsets"]
            if not 0 <= begin <= end <= len(data):
                raise ValueError("tensor %s has data_offsets %s outside the %d data bytes"
                                 % (name, info["data_offsets"], len(data)))
            out[name] = _tensor_of(data[begin:end], dtype).reshape(info["shape"])
        return out
    except (ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:  # JSON, shapes: one line
        raise _not_weights(path, "not a valid safetensors file (%s)" % str(e).splitlines()[0]) from None


# The globals a pickled dict of tensors names (torch.save, and LibTorch's pickler that export uses).
_STORAGES = {"FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
             "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
             "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
             "BoolStorage": torch.bool}
_GLOBALS = {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict")} | {("torch", s) for s in _STORAGES}


class _Global(tuple):
    pass


def _rebuild_tensor(path, args):
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]),
    the view checked against its storage."""
    if not (6 <= len(args) <= 7 and isinstance(args[0], torch.Tensor) and isinstance(args[1], int)
            and all(isinstance(a, tuple) and all(isinstance(i, int) and i >= 0 for i in a) for a in args[2:4])
            and len(args[2]) == len(args[3]) and all(a == {} if isinstance(a, dict) else a is None for a in args[5:])):
        raise _not_weights(path, "a tensor of unexpected arguments (%s)" % ", ".join(type(a).__name__ for a in args))
    storage, offset, size, stride = args[:4]
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset - 1
    if offset < 0 or last >= storage.numel():
        raise _not_weights(path, "a tensor of size %s beyond its storage of %d" % (size, storage.numel()))
    return storage.as_strided(size, stride, offset)


# Not torch.load(weights_only=True): Debian's torch 1.13 hands a TorchScript archive to torch.jit.load
# (whose __setstate__ runs), and its weights-only unpickler could be made to run code
# (CVE-2025-32434, fixed in torch 2.6).
def _read_tensor_dict_pickle(path, program, storage):
    """The dict name -> tensor a pickle program builds, interpreted here: only the opcodes such a
    dict needs, calling nothing but _rebuild_tensor and dict (pickle.Unpickler would look callables
    up by name)."""
    stack, marks, memo, pos = [], [], {}, 0

    def take(n):
        nonlocal pos
        if pos + n > len(program):
            raise _not_weights(path, "its pickle ends early")
        pos += n
        return program[pos - n:pos]

    def pop_mark():
        if not marks:
            raise _not_weights(path, "its pickle pops a mark it never set")
        at = marks.pop()
        items = stack[at:]
        del stack[at:]
        return items

    def num(fmt):
        return struct.unpack(fmt, take(struct.calcsize(fmt)))[0]

    try:
        while True:
            op = take(1)[0]
            if op == 0x80:  # PROTO
                take(1)
            elif op == 0x95:  # FRAME
                take(8)
            elif op == ord("."):  # STOP
                break
            elif op == ord("("):
                marks.append(len(stack))
            elif op == ord("}"):
                stack.append({})
            elif op == ord(")"):
                stack.append(())
            elif op == ord("t"):
                stack.append(tuple(pop_mark()))
            elif op in (0x85, 0x86, 0x87):  # TUPLE1..3
                n = op - 0x84
                if len(stack) < n:
                    raise IndexError
                stack[-n:] = [tuple(stack[-n:])]
            elif op in (ord("u"), ord("s")):  # SETITEMS, SETITEM
                items = pop_mark() if op == ord("u") else [stack.pop(-2), stack.pop()]
                if len(items) % 2 or not isinstance(stack[-1], dict):
                    raise _not_weights(path, "its pickle sets items of a %s" % type(stack[-1]).__name__)
                stack[-1].update(zip(items[::2], items[1::2]))
            elif op in (ord("X"), 0x8C):  # BINUNICODE, SHORT_BINUNICODE
                stack.append(take(num("<I") if op == ord("X") else take(1)[0]).decode("utf-8"))
            elif op == ord("J"):
                stack.append(num("<i"))
            elif op == ord("K"):
                stack.append(take(1)[0])
            elif op == ord("M"):
                stack.append(num("<H"))
            elif op == 0x8A:  # LONG1
                stack.append(int.from_bytes(take(take(1)[0]), "little", signed=True))
            elif op == ord("G"):
                stack.append(num(">d"))
            elif op in (ord("N"), 0x88, 0x89):
                stack.append({ord("N"): None, 0x88: True, 0x89: False}[op])
            elif op in (ord("q"), ord("r"), 0x94):  # BINPUT, LONG_BINPUT, MEMOIZE
                memo[take(1)[0] if op == ord("q") else num("<I") if op == ord("r") else len(memo)] = stack[-1]
            elif op in (ord("h"), ord("j")):  # BINGET, LONG_BINGET
                stack.append(memo[take(1)[0] if op == ord("h") else num("<I")])
            elif op == ord("c"):  # GLOBAL "module\nname\n": a name, looked up in _GLOBALS only
                module, name = (program[pos:pos + 200].split(b"\n") + [b"", b""])[:2]
                take(len(module) + len(name) + 2)
                name = (module.decode("latin-1"), name.decode("latin-1"))
                if name not in _GLOBALS:
                    raise _not_weights(path, "its pickle names %s, not part of a dict of tensors" % ".".join(name))
                stack.append(_Global(name))
            elif op == ord("Q"):  # BINPERSID: a storage
                stack.append(storage(stack.pop()))
            elif op == ord("R"):  # REDUCE
                args, f = stack.pop(), stack[-1]
                if not isinstance(f, _Global):
                    raise _not_weights(path, "its pickle calls a %s" % type(f).__name__)
                if f == ("collections", "OrderedDict") and isinstance(args, tuple) and not args:
                    stack[-1] = {}
                elif f == ("torch._utils", "_rebuild_tensor_v2") and isinstance(args, tuple):
                    stack[-1] = _rebuild_tensor(path, args)
                else:
                    raise _not_weights(path, "its pickle calls %s with %s arguments"
                                       % (".".join(f), type(args).__name__))
            else:
                raise _not_weights(path, "its pickle has opcode %r at byte %d, not one a dict of tensors needs"
                                   % (bytes([op]), pos - 1))
    except (IndexError, KeyError, TypeError, RuntimeError, OverflowError, UnicodeDecodeError, struct.error) as e:
        # e.g. an unhashable key, a size past int64 in as_strided
        raise _not_weights(path, "its pickle is malformed at byte %d (%s)" % (pos, type(e).__name__)) from None
    state = stack[0] if len(stack) == 1 else None
    if not (isinstance(state, dict)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items())):
        raise _not_weights(path, "its pickle is not one dict name -> tensor")
    return state


def read_torch_zip(path):
    """model.pt as `normlab export` writes it (torch.save's zip: FOLDER/data.pkl, the pickle of a dict
    name -> tensor, and FOLDER/data/KEY, each storage's bytes), read without torch.load: torch.load
    hands a TorchScript zip to torch.jit.load even with weights_only (PyTorch 1.13), and a pickle
    can run code."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise _not_weights(path, "not a zip archive (%s)" % e) from None
    with archive:
        names = archive.namelist()
        pickles = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
        if any(n.split("/", 1)[-1].startswith(("code/", "constants.pkl")) for n in names):
            raise _not_weights(path, "a TorchScript archive (it holds code)")
        if len(pickles) != 1:
            raise _not_weights(path, "a zip without one FOLDER/data.pkl")
        folder, storages = pickles[0][:-len("data.pkl")], {}

        def storage(pid):  # ("storage", torch.<T>Storage, key, location, numel)
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Global)
                    and pid[1][1] in _STORAGES and isinstance(pid[2], str) and isinstance(pid[4], int)):
                raise _not_weights(path, "its pickle loads a persistent %s, not a storage" % type(pid).__name__)
            if pid[2] not in storages:
                dtype = _STORAGES[pid[1][1]]
                try:
                    blob = archive.read(folder + "data/" + pid[2])
                except KeyError:
                    raise _not_weights(path, "no storage data/%s" % pid[2]) from None
                if len(blob) != pid[4] * torch.empty(0, dtype=dtype).element_size():
                    raise _not_weights(path, "storage data/%s has %d bytes, not %d of %s"
                                       % (pid[2], len(blob), pid[4], dtype))
                storages[pid[2]] = _tensor_of(blob, dtype)
            return storages[pid[2]]

        return _read_tensor_dict_pickle(path, archive.read(pickles[0]), storage)


def load_state_dict(path, map_location="cpu"):
    """The exported weights: a plain dict name -> tensor, from model.pt (torch.save's zip of such a
    dict, read by read_torch_zip) or the safetensors file of `--format hf` (with the `safetensors`
    package when installed). Anything else is a ValueError: neither torch.load nor pickle runs."""
    if not path.endswith(".safetensors"):
        state = read_torch_zip(path)
    else:
        try:
            from safetensors.torch import load_file
        except ImportError:
            load_file = None
        if load_file is None:
            state = read_safetensors(path)
        else:
            try:
                return load_file(path, device=str(map_location))
            except OSError:
                raise
            except Exception as e:  # SafetensorError: say which file
                raise _not_weights(path, "not a valid safetensors file (%s)" % str(e).splitlines()[0]) from None
    return {k: v.to(map_location) for k, v in state.items()}


def _export_file(export_dir, name):
    """A file config.json names: one inside the export folder (a crafted config may name any path)."""
    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name:
        raise ValueError("normlab_torch: %s: config.json names the file %s; expected a file name in that folder"
                         % (export_dir, json.dumps(name)))
    return os.path.join(export_dir, name)


_HF_LLAMA_LAYER = {
    "input_layernorm.weight": "self_attn_norm.weight",
    "self_attn.q_proj.weight": "self_attn.q_proj.weight",
    "self_attn.k_proj.weight": "self_attn.k_proj.weight",
    "self_attn.v_proj.weight": "self_attn.v_proj.weight",
    "self_attn.o_proj.weight": "self_attn.out_proj.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn.gate.weight",
    "mlp.up_proj.weight": "ffn.fc1.weight",
    "mlp.down_proj.weight": "ffn.fc2.weight",
}


def from_hf_llama_names(state):
    """normlab's names of a `--format hf` export written with HF Llama's (config.json
    "weight_names": "hf-llama" with no "hf_weights": normlab before issue 67.3)."""
    out = {}
    for name, t in state.items():
        if name == "model.embed_tokens.weight":
            out["decoder.embed_tokens.weight"] = t
        elif name == "model.norm.weight":
            out["decoder.layer_norm.weight"] = t
        elif name == "lm_head.weight":
            out["decoder.output_projection.weight"] = t
        else:
            parts = name.split(".", 3)  # model, layers, N, rest
            if len(parts) != 4 or parts[:2] != ["model", "layers"] or parts[3] not in _HF_LLAMA_LAYER:
                raise ValueError("%s: not a parameter of an HF Llama export" % name)
            out["decoder.layers.%s.%s" % (parts[2], _HF_LLAMA_LAYER[parts[3]])] = t
    return out


def from_hf_weights(state, cfg):
    """normlab's tensors of a `--format hf` export written as an HF class: config.json "hf_weights"
    gives each HF tensor's normlab name, or {from, scale, add} where export folded constants in
    (hf = normlab · scale + add: LN-Scaling's 1/√ℓ, Gemma 2's γ − 1 and embedding / √d); a normlab
    tensor that two HF tensors hold (Gemma 2's lm_head and embedding) is taken from the unscaled one."""
    mapping, out, exact = cfg["hf_weights"], {}, set()
    for name in sorted(state, key=lambda n: not isinstance(mapping.get(n), str)):
        if name not in mapping:
            raise ValueError("%s: not a tensor of this export (config.json \"hf_weights\" has no such name)" % name)
        entry = mapping[name]
        if isinstance(entry, str):
            out[entry] = state[name]
            exact.add(entry)
        elif entry["from"] not in exact:
            t = state[name]
            out[entry["from"]] = ((t.double() - float(entry["add"])) / float(entry["scale"])).to(t.dtype)
    return out


def load(export_dir, map_location="cpu"):
    """The model of `normlab export ... --to export_dir`, weights loaded (strict), in eval mode."""
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("format") != "normlab-export":
        raise ValueError("%s: not a normlab export (config.json format is %r)"
                         % (export_dir, cfg.get("format")))
    model = NormlabTransformer(cfg)
    state = load_state_dict(_export_file(export_dir, cfg.get("weights")), map_location)
    if "hf_weights" in cfg:
        state = from_hf_weights(state, cfg)
    elif cfg.get("weight_names") == "hf-llama":
        state = from_hf_llama_names(state)
    model.load_state_dict(state)
    return model.eval()


# ---- tokenizers ---------------------------------------------------------------------------------


class SyntheticTokenizer:
    """The synthetic tasks' words (core/src/data/synthetic_tasks.cpp SyntheticTokenizer): ids 4 …
    4+V−1 are "w0" … "w{V−1}"; encode splits on whitespace and maps any other word to unk, decode
    skips the specials."""

    def __init__(self, symbols, unk_id=1):
        self.symbols, self.unk_id = int(symbols), unk_id

    def encode(self, text):
        ids = []
        for word in text.split():
            digits = word[1:]
            ok = (word[:1] == "w" and 1 <= len(digits) <= 9 and digits.isdigit() and digits.isascii()
                  and (len(digits) == 1 or digits[0] != "0"))
            ids.append(4 + int(digits) if ok and int(digits) < self.symbols else self.unk_id)
        return ids

    def decode(self, ids):
        return " ".join("w%d" % (i - 4) for i in ids if 4 <= i < 4 + self.symbols)


class SentencePieceTokenizer:
    """A SentencePiece model as normlab uses it (core/src/data/sentencepiece_tokenizer.cpp): ids 0 pad,
    1 unk, 2 bos, 3 eos; encode adds neither bos nor eos; decode drops ids ≤ eos and out-of-range ones.
    Read with the `sentencepiece` package (github.com/google/sentencepiece, python/)."""

    def __init__(self, path):
        try:
            import sentencepiece
        except ImportError:
            raise ImportError("normlab_torch: the tokenizer %s is a SentencePiece model; reading it needs the "
                              "sentencepiece package: pip install sentencepiece (Debian's python3: apt-get install "
                              "python3-sentencepiece)" % path) from None
        self.path = path
        self.sp = sentencepiece.SentencePieceProcessor()
        if not self.sp.Load(path):  # Load/EncodeAsIds/DecodeIds: in every release of the package
            raise ValueError("normlab_torch: %s is not a SentencePiece model" % path)
        self.pieces = self.sp.GetPieceSize()

    def encode(self, text):
        return list(self.sp.EncodeAsIds(text))

    def decode(self, ids):
        return self.sp.DecodeIds([int(i) for i in ids if 3 < i < self.pieces])


class Tokenizers:
    """The export's tokenizers: `src` (the encoder's; None for an LM) and `tgt` (the decoder's, also
    an LM's); one object for both sides where the run has one model. encode/decode are tgt's."""

    def __init__(self, src, tgt, eos_id):
        self.src, self.tgt, self.eos_id = src, tgt, eos_id

    def encode_source(self, text):  # as `normlab translate` reads a line: its ids, then eos
        if self.src is None:
            raise ValueError("normlab_torch: an LM has no source side")
        return self.src.encode(text) + [self.eos_id]

    def encode(self, text):
        return self.tgt.encode(text)

    def decode(self, ids):
        return self.tgt.decode(ids)


def load_tokenizers(export_dir):
    """The tokenizer(s) `normlab export` wrote beside the weights, as config.json "tokenizer" names them:
    SentencePiece models (tokenizer.model, or tokenizer.src.model + tokenizer.tgt.model), or the
    synthetic tasks' words."""
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    t, ids = cfg.get("tokenizer", {}), cfg["special_ids"]
    lm = cfg["arch"] == "lm"
    if t.get("type") == "ids":  # token shards: ids of a tokenizer normlab did not make
        return Tokenizers(None, None, ids["eos"])
    if t.get("type") == "synthetic":
        tok = SyntheticTokenizer(t["symbols"], ids["unk"])
        return Tokenizers(None if lm else tok, tok, ids["eos"])
    if t.get("type") == "sentencepiece":
        if "model" in t:
            tok = SentencePieceTokenizer(_export_file(export_dir, t["model"]))
            return Tokenizers(None if lm else tok, tok, ids["eos"])
        return Tokenizers(SentencePieceTokenizer(_export_file(export_dir, t["src_model"])),
                          SentencePieceTokenizer(_export_file(export_dir, t["tgt_model"])), ids["eos"])
    raise ValueError("normlab_torch: %s: config.json names the tokenizer %r, which this file cannot read "
                     "(known: sentencepiece, synthetic)" % (export_dir, t))


# ---- generation ---------------------------------------------------------------------------------
# As `normlab translate` decodes (core/src/eval/beam_search.cpp, after fairseq's SequenceGenerator):
# per step the log-softmax (fp32) of the last position's logits, pad and bos never generated, eos
# not before min_len tokens and forced at the length limit; scores summed in float64; a finished
# hypothesis scores log p / (tokens + 1)^lenpen (the +1 is eos). The decoder reruns on the whole
# prefix each step (no incremental state): simple and exact, slower than a k/v cache.


class Hypothesis:
    """tokens: the generated ids, without the prompt or bos and without eos; log_prob: Σ log p over
    them and eos (when it ended so); score: log_prob / (len(tokens) + 1)^lenpen."""

    def __init__(self, tokens, log_prob, score):
        self.tokens, self.log_prob, self.score = tokens, log_prob, score

    def __repr__(self):
        return "Hypothesis(tokens=%s, log_prob=%.6g, score=%.6g)" % (self.tokens, self.log_prob, self.score)


class _Decoder:
    """The next-token log-probabilities of a batch of same-length continuations: for an LM after
    `prompt`, for an encoder-decoder after bos given the encoded source."""

    def __init__(self, model, ids):
        self.model, special = model, model.cfg["special_ids"]
        self.pad, self.bos, self.eos = special["pad"], special["bos"], special["eos"]
        ids = [int(i) for i in ids]
        if model.encoder is not None and (not ids or ids[-1] != self.eos):
            ids.append(self.eos)  # a source ends with eos, as translate's
        device = next(model.parameters()).device
        ids = torch.tensor(ids, dtype=torch.long, device=device).view(1, -1)
        if model.encoder is not None:
            self.memory, self.memory_mask = model.encode(ids)
            self.prefix = torch.full((1, 1), self.bos, dtype=torch.long, device=device)
        else:
            if ids.numel() == 0:
                raise ValueError("normlab_torch: an LM needs a prompt of at least one token (e.g. [eos])")
            self.prefix = ids
        self.source_len = ids.size(1)

    def log_probs(self, continuations, step, min_len):
        """[rows, V] float64 log p of the next token after each row of `continuations` [rows, step]."""
        rows = continuations.size(0)
        tokens = torch.cat([self.prefix.expand(rows, -1), continuations], 1)
        if self.model.encoder is not None:
            logits = self.model.decode(tokens, self.memory.expand(rows, -1, -1),
                                       self.memory_mask.expand(rows, -1, -1, -1))
        else:
            logits = self.model.forward_lm(tokens)
        lp = torch.log_softmax(logits[:, -1].float(), -1)
        lp[:, self.pad] = float("-inf")
        lp[:, self.bos] = float("-inf")
        if step < min_len:
            lp[:, self.eos] = float("-inf")
        return lp.double()

    def limit(self, max_len_a, max_len_b):
        # None: for a translation, the run's eval.max_len_a/b from config.json "decoding" (normlab
        # translate's default); for an LM, and exports without "decoding", fairseq's 0 and 200.
        run = self.model.cfg.get("decoding", {}) if self.model.encoder is not None else {}
        a = run.get("max_len_a", 0.0) if max_len_a is None else max_len_a
        b = run.get("max_len_b", 200) if max_len_b is None else max_len_b
        return int(a * self.source_len + b)


class _EvalMode:
    """Decoding in eval mode (no dropout), the model's training flag restored after (as beam_search.cpp)."""

    def __init__(self, model):
        self.model, self.was_training = model, model.training

    def __enter__(self):
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.was_training)


@torch.no_grad()
def greedy_search(model, ids, lenpen=1.0, max_len_a=None, max_len_b=None, min_len=1):
    """The most likely next token each step until eos (the limit forces it): for an encoder-decoder
    `ids` is the source (eos appended unless there), for an LM the prompt it continues. The limit on
    generated tokens is int(max_len_a · n + max_len_b), n the source's length with eos (as
    translate's) or the prompt's; max_len_a/b None: the run's eval.max_len_a/b (config.json
    "decoding"), as normlab translate. Equals beam_search with beam 1 (and `normlab translate --beam 1`)."""
    with _EvalMode(model):
        return _greedy(_Decoder(model, ids), lenpen, max_len_a, max_len_b, min_len)


def _greedy(dec, lenpen, max_len_a, max_len_b, min_len):
    limit = dec.limit(max_len_a, max_len_b)
    out, log_prob = [], 0.0
    cont = torch.empty(1, 0, dtype=torch.long, device=dec.prefix.device)
    for step in range(limit + 1):
        lp = dec.log_probs(cont, step, min_len)[0]
        token = dec.eos if step >= limit else int(lp.argmax())
        log_prob += float(lp[token])
        if token == dec.eos:
            break
        out.append(token)
        cont = torch.cat([cont, cont.new_full((1, 1), token)], 1)
    return Hypothesis(out, log_prob, log_prob / float(len(out) + 1) ** lenpen)


@torch.no_grad()
def beam_search(model, ids, beam=5, lenpen=1.0, max_len_a=None, max_len_b=None, min_len=1):
    """Beam search as `normlab translate` (core/src/eval/beam_search.cpp) and fairseq's
    SequenceGenerator: each step the 2·beam best (hypothesis, token) extensions; eos among the best
    `beam` finishes a hypothesis, scored log p / (tokens + 1)^lenpen; the search stops at `beam`
    finished ones. `ids` and the limit as in greedy_search. Returns the finished hypotheses, best
    first."""
    with _EvalMode(model):
        return _beam(_Decoder(model, ids), max(int(beam), 1), lenpen, max_len_a, max_len_b, min_len)


def _beam(dec, K, lenpen, max_len_a, max_len_b, min_len):
    limit = dec.limit(max_len_a, max_len_b)
    beams = [([], 0.0)]  # (tokens, log p)
    finished = []
    for step in range(limit + 1):
        cont = torch.tensor([b[0] for b in beams], dtype=torch.long, device=dec.prefix.device).view(len(beams), step)
        lp = dec.log_probs(cont, step, min_len)
        if step >= limit:  # only eos
            keep = torch.full_like(lp, float("-inf"))
            keep[:, dec.eos] = lp[:, dec.eos]
            lp = keep
        V = lp.size(1)
        totals = (lp + torch.tensor([b[1] for b in beams], dtype=torch.float64, device=lp.device).unsqueeze(1)).view(-1)
        take = min(2 * K, int(torch.isfinite(totals).sum()))
        scores, flat = totals.topk(take)
        nxt = []
        for r in range(take):
            b, token, total = int(flat[r]) // V, int(flat[r]) % V, float(scores[r])
            if token == dec.eos:
                if r < K and len(finished) < K:  # only eos among the best K ends a hypothesis (fairseq)
                    tokens = beams[b][0]
                    finished.append(Hypothesis(list(tokens), total, total / float(len(tokens) + 1) ** lenpen))
            elif len(nxt) < K:
                nxt.append((beams[b][0] + [token], total))
        if len(finished) >= K or not nxt:
            break
        beams = nxt
    return sorted(finished, key=lambda h: -h.score)


def generate(model, ids, beam=1, lenpen=1.0, max_len_a=None, max_len_b=None, min_len=1):
    """The best Hypothesis for `ids`: a translation of the source (encoder-decoder) or a continuation
    of the prompt (LM); beam 1 is greedy_search, otherwise beam_search."""
    if beam <= 1:
        return greedy_search(model, ids, lenpen, max_len_a, max_len_b, min_len)
    return beam_search(model, ids, beam, lenpen, max_len_a, max_len_b, min_len)[0]


def translate(model, tokenizers, text, **options):
    """One source sentence translated, as `normlab translate` does (options as generate's)."""
    return tokenizers.decode(generate(model, tokenizers.encode_source(text), **options).tokens)


def complete(model, tokenizers, prompt, max_new_tokens=50, **options):
    """The rest of a line after `prompt`, from an LM (options as generate's). The prompt follows an eos,
    as a line does in the training stream (lines joined by eos, core/src/data/lm_corpus.cpp)."""
    options.setdefault("max_len_a", 0.0)
    options.setdefault("max_len_b", max_new_tokens)
    return tokenizers.decode(generate(model, [tokenizers.eos_id] + tokenizers.encode(prompt), **options).tokens)
