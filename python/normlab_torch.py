"""normlab models in plain PyTorch: load what `normlab export RUN --to DIR` wrote.

    import normlab_torch
    model = normlab_torch.load("DIR")            # eval mode, CPU
    logits = model(src, tgt_in)                  # encoder-decoder: [B, T, tgt_vocab]
    logits = model.forward_lm(tokens)            # decoder-only:    [B, T, tgt_vocab]

DIR holds model.pt (a state_dict: `torch.load("DIR/model.pt")` is a dict of tensors whose names are
the ones below), config.json (geometry, scheme and its parameters, tokenizer) and the tokenizer
model(s). Token ids: 0 pad, 1 unk, 2 bos, 3 eos; a target prefix starts with bos.

Parameter names (`<stack>` is `encoder` or `decoder`; the LM has only `decoder`):
    <stack>.embed_tokens.weight                      [vocab, d] (absent on the decoder when
                                                     share_embeddings = "all": it is the encoder's)
    <stack>.layers.<i>.self_attn.{q,k,v,out}_proj.{weight,bias}
    decoder.layers.<i>.cross_attn.{q,k,v,out}_proj.{weight,bias}   (encoder-decoder only)
    <stack>.layers.<i>.ffn.fc1.{weight,bias}, ffn.fc2.{weight,bias}
    <stack>.layers.<i>.<sublayer>_norm.{weight,bias} and the scheme's own tensors (see SCHEMES)
    <stack>.layer_norm.{weight,bias}                 the final LayerNorm (pre-ln, sandwich-ln)
    decoder.output_projection.weight                 [tgt_vocab, d] (share_embeddings = "none";
                                                     otherwise the target embedding is the output)

Plain PyTorch, no normlab import: the forward pass below is normlab's (core/src/model and
plugins/*), written out once per scheme, in eval mode (dropout is the identity).
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYER_NORM_EPS = 1e-5
SUBLAYERS_ENC = ("self_attn", "ffn")           # an encoder or LM layer
SUBLAYERS_DEC = ("self_attn", "cross_attn", "ffn")  # a decoder layer of an encoder-decoder model


def sinusoidal_positions(T, d):
    """Vaswani et al. 2017 sec. 3.5 in fairseq's layout: sines then cosines, positions from 0."""
    half = d // 2
    freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000.0) / max(half - 1, 1)))
    pos = torch.arange(T, dtype=torch.float).unsqueeze(1) * freq.unsqueeze(0)
    table = torch.cat([torch.sin(pos), torch.cos(pos)], 1)
    if d % 2 == 1:
        table = torch.cat([table, torch.zeros(T, 1)], 1)
    return table


def key_padding_mask(tokens, pad_id):
    """Additive mask [B,1,1,T]: -inf where the key is padding."""
    m = torch.zeros(tokens.shape, dtype=torch.float, device=tokens.device)
    m = m.masked_fill(tokens.eq(pad_id), float("-inf"))
    return m.view(tokens.size(0), 1, 1, tokens.size(1))


def causal_mask(T, device):
    return torch.full((T, T), float("-inf"), device=device).triu(1).view(1, 1, T, T)


class MultiheadAttention(nn.Module):
    """Scaled dot-product attention (Vaswani et al. 2017 sec. 3.2.2), separate q/k/v projections."""

    def __init__(self, d, heads):
        super().__init__()
        self.d, self.heads = d, heads
        self.q_proj, self.k_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.v_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, query, memory, mask):
        B, Tq, Tk, dh = query.size(0), query.size(1), memory.size(1), self.d // self.heads
        q = self.q_proj(query).view(B, Tq, self.heads, dh).transpose(1, 2)
        k = self.k_proj(memory).view(B, Tk, self.heads, dh).transpose(1, 2)
        v = self.v_proj(memory).view(B, Tk, self.heads, dh).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh)
        if mask is not None:
            scores = scores + mask
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.out_proj(ctx.transpose(1, 2).reshape(B, Tq, self.d))


class FeedForward(nn.Module):
    """FFN(h) = W2 · ReLU(W1 · h) (Vaswani et al. 2017 sec. 3.3)."""

    def __init__(self, d, ffn_dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, ffn_dim), nn.Linear(ffn_dim, d)

    def forward(self, h):
        return self.fc2(torch.relu(self.fc1(h)))


# ---- schemes ------------------------------------------------------------------------------------
# Each scheme names the tensors it adds to a layer (LayerNorms, learnable scales) and wires one
# layer: forward(layer, x, branch) where branch(name, h) runs sublayer `name` on h and layer.norm /
# layer.param reach its LayerNorms and tensors. Equations as in ../shared/SCHEMES.md and each
# plugin's source (plugins/<scheme>/<scheme>.cpp).


class Scheme:
    final_layer_norm = False

    def __init__(self, cfg):
        self.cfg = cfg
        self.params = cfg["scheme"].get("params", {})

    def layer_norms(self, sublayers):
        return [s + "_norm" for s in sublayers]

    def layer_params(self, sublayers, d):  # name -> shape
        return {}

    def forward(self, layer, x, branch):
        raise NotImplementedError


class PostLN(Scheme):
    """Post-LN, Vaswani et al. 2017 sec. 3.1 (B2T paper eq. (1)): y = LN(x + F(x)) per sublayer.
    Also post-ln-init (DeepNet sec. II) and ds-init (Zhang et al. 2019 eq. 9): they change only
    the initialization, not the forward pass."""

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = layer.norm(s + "_norm", x + branch(s, x))
        return x


class PreLN(Scheme):
    """Pre-LN, Xiong et al. 2020 (B2T paper eq. (2)): y = x + F(LN(x)); a final LN per stack."""
    final_layer_norm = True

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + branch(s, layer.norm(s + "_norm", x))
        return x


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
    """Admin, Liu et al. 2020 ("Understanding the Difficulty of Training Transformers"; SCHEMES.md):
    y = LN(ω_i ⊙ x + F(x)), ω_i ∈ R^d learnable per sublayer (tensor `<sublayer>_omega`); the
    profiling pass only sets ω's initial value, which the exported weights already hold."""

    def layer_params(self, sublayers, d):
        return {s + "_omega": (d,) for s in sublayers}

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = layer.norm(s + "_norm", layer.param(s + "_omega") * x + branch(s, x))
        return x


class ReZero(Scheme):
    """ReZero, Bachlechner et al. 2021 ("ReZero is All You Need"): y = x + g·F(x), one learnable scalar gate g per
    sublayer (tensor `<sublayer>_gate`, shape [1]), no LayerNorm."""

    def layer_norms(self, sublayers):
        return []

    def layer_params(self, sublayers, d):
        return {s + "_gate": (1,) for s in sublayers}

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + layer.param(s + "_gate") * branch(s, x)
        return x


class SandwichLN(Scheme):
    """Sandwich-LN, Ding et al. 2021 (CogView) sec. 2.4: y = x + LN_out(F(LN_in(x))) with
    LN_in = `<sublayer>_norm`, LN_out = `<sublayer>_out_norm`; a final LN per stack."""
    final_layer_norm = True

    def layer_norms(self, sublayers):
        return [n for s in sublayers for n in (s + "_norm", s + "_out_norm")]

    def forward(self, layer, x, branch):
        for s in layer.sublayers:
            x = x + layer.norm(s + "_out_norm", branch(s, layer.norm(s + "_norm", x)))
        return x


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
}


def make_scheme(cfg):
    name = cfg["scheme"]["name"]
    if cfg.get("norm", "layernorm") != "layernorm":
        raise ValueError("normlab_torch: norm kind '%s' (scheme.norm) has no PyTorch version here (known: layernorm)"
                         % cfg["norm"])
    if name not in SCHEMES:
        raise ValueError("normlab_torch: scheme '%s' has no PyTorch version here (known: %s)"
                         % (name, ", ".join(sorted(SCHEMES))))
    return SCHEMES[name](cfg)


# ---- the model ----------------------------------------------------------------------------------


class Layer(nn.Module):
    def __init__(self, cfg, scheme, stack, sublayers):
        super().__init__()
        d = cfg["d_model"]
        self.scheme, self.stack, self.sublayers = scheme, stack, sublayers
        self.self_attn = MultiheadAttention(d, cfg["heads"])
        if "cross_attn" in sublayers:
            self.cross_attn = MultiheadAttention(d, cfg["heads"])
        self.ffn = FeedForward(d, cfg["ffn_dim"])
        for name in scheme.layer_norms(sublayers):
            setattr(self, name, nn.LayerNorm(d, eps=cfg.get("layer_norm_eps", LAYER_NORM_EPS)))
        for name, shape in scheme.layer_params(sublayers, d).items():
            setattr(self, name, nn.Parameter(torch.ones(shape)))

    def norm(self, name, x):
        return getattr(self, name)(x)

    def param(self, name):
        return getattr(self, name)

    def forward(self, x, self_mask, memory=None, memory_mask=None):
        def branch(s, h):
            if s == "self_attn":
                return self.self_attn(h, h, self_mask)
            if s == "cross_attn":
                return self.cross_attn(h, memory, memory_mask)
            return self.ffn(h)

        return self.scheme.forward(self, x, branch)


class Stack(nn.Module):
    def __init__(self, cfg, scheme, stack, embed, owns_embedding):
        super().__init__()
        d = cfg["d_model"]
        self.d = d
        if owns_embedding:
            self.embed_tokens = embed
        else:  # shared with the encoder: not registered twice (the state_dict names it once)
            self._shared = [embed]
        sublayers = SUBLAYERS_DEC if (stack == "decoder" and cfg["arch"] == "encdec") else SUBLAYERS_ENC
        n = cfg["enc_layers"] if stack == "encoder" else cfg["dec_layers"]
        self.layers = nn.ModuleList(Layer(cfg, scheme, stack, sublayers) for _ in range(n))
        if scheme.final_layer_norm:
            self.layer_norm = nn.LayerNorm(d, eps=cfg.get("layer_norm_eps", LAYER_NORM_EPS))

    @property
    def embedding(self):
        return self.embed_tokens if "embed_tokens" in self._modules else self._shared[0]

    def forward(self, tokens, self_mask, memory=None, memory_mask=None):
        x = self.embedding(tokens) * math.sqrt(self.d)
        x = x + sinusoidal_positions(tokens.size(1), self.d).to(x).unsqueeze(0)
        for layer in self.layers:
            x = layer(x, self_mask, memory, memory_mask)
        if hasattr(self, "layer_norm"):
            x = self.layer_norm(x)
        return x


class NormlabTransformer(nn.Module):
    """The encoder-decoder (translation) or decoder-only (LM) Transformer of an export's config."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.scheme = make_scheme(cfg)
        d, pad = cfg["d_model"], cfg["special_ids"]["pad"]
        self.pad_id = pad
        sharing = cfg["share_embeddings"]
        tgt_embed = nn.Embedding(cfg["tgt_vocab"], d, padding_idx=pad)
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

    def output_logits(self, hidden):
        if hasattr(self.decoder, "output_projection"):
            return self.decoder.output_projection(hidden)
        return F.linear(hidden, self.decoder.embedding.weight)

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


def load_state_dict(path, map_location="cpu"):
    """The exported weights: a plain dict name -> tensor (torch.load of model.pt)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except TypeError:  # torch < 1.13 has no weights_only
        return torch.load(path, map_location=map_location)


def load(export_dir, map_location="cpu"):
    """The model of `normlab export ... --to export_dir`, weights loaded (strict), in eval mode."""
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("format") != "normlab-export":
        raise ValueError("%s: not a normlab export (config.json format is %r)"
                         % (export_dir, cfg.get("format")))
    model = NormlabTransformer(cfg)
    model.load_state_dict(load_state_dict(os.path.join(export_dir, cfg["weights"]), map_location))
    return model.eval()
