"""The paper figures normlab reproduces (docs/reproducing.md): what each paper figure
shows, which of our figures to set beside it, and the statistics that decide whether the effect
reproduced. Used by normlab_plots.py (figures), normlab_report.py (the "paper view") and the
reduced tests (tests/repro/check_repro.py), so the docs, the report and the tests measure the
same thing. Standard library only.

A sweep is tied to a paper figure by its name (`[sweep] name`, sweep.json's "name"): a sweep
named after a key of PAPER_VIEWS gets that view in `normlab report`.
"""
import difflib
import math
import statistics
from collections import OrderedDict, defaultdict

PAPER_VIEWS = OrderedDict([
    ("deepnet-fig4", {
        "paper": "DeepNet (Wang et al. 2022, IEEE TPAMI version)",
        "figure": "Fig. 4",
        "title": "Model update of Post-LN and DeepNet at the early stage of training",
        "shows": "‖ΔF‖ = ‖F(x,θ_t) − F(x,θ_0)‖ over the first updates of 64-128-2 encoder-decoders "
                 "on IWSLT-14 De-En, 6L-6L to 100L-100L: Post-LN's update grows with depth "
                 "(the accumulation of Theorem 3, O(M·Σ‖Δθ‖)), DeepNet's stays small and nearly "
                 "the same at every depth.",
        "compare": "In update_norm_depths, the spread of Post-LN's curves across depths against "
                   "DeepNorm's; in update_norm_vs_depth, the slope of each scheme's line. "
                   "Post-LN-init (DeepNet §II) shows the effect of down-scaled initialisation alone.",
        "figures": ["update_norm_depths", "update_norm_vs_depth"],
    }),
    ("b2t-fig3", {
        "paper": "B2T connection (Takase et al. 2023, Findings of ACL)",
        "figure": "Fig. 3",
        "title": "Gradient norms of each layer at the beginning of training, 18L-18L",
        "shows": "Per-layer gradient norms of (a) the encoder and (b) the decoder of 18L-18L "
                 "models on WMT En-De at the start of training: Post-LN's decoder norms decay "
                 "exponentially toward the lower layers (vanishing gradient); B2T keeps them "
                 "close to flat; Pre-LN's are flat to decreasing with the layer (higher layers "
                 "get smaller gradients).",
        "compare": "The decoder panel of grad_norm_start: the drop of Post-LN's line from the top "
                   "layer to layer 1 against B2T's and Pre-LN's.",
        "figures": ["grad_norm_start"],
    }),
    ("branchnorm-fig4-fig7", {
        "paper": "BranchNorm (Liu et al. 2023, EMNLP)",
        "figure": "Fig. 4 and Fig. 7",
        "title": "Gradient norm at the beginning of training; FFN activation sparsity per layer",
        "shows": "Fig. 4: the gradient norm over the first updates; BranchNorm's curve is smoother "
                 "than DeepNorm's. Fig. 7: the share of non-zero entries after the FFN's ReLU in "
                 "each layer of trained 100L-100L models; BranchNorm's is lower (sparser) in every "
                 "layer.",
        "compare": "grad_norm_smoothness: the roughness σ(Δ ln‖g‖) in the legend (lower = "
                   "smoother); ffn_nonzero: BranchNorm's bars against DeepNorm's, layer by layer.",
        "figures": ["grad_norm_smoothness", "ffn_nonzero"],
    }),
])

START_WINDOW = 20  # "the beginning of training" for B2T Fig. 3: recorded updates 1..20


def view_of(sweep):
    """The paper view key of a sweep (its name), or None."""
    return sweep.name if sweep.name in PAPER_VIEWS else None


def near_view(name):
    """The paper view a sweep name that is none resembles (a typo, another separator, a suffix),
    or None: the report says so instead of silently showing no paper view."""
    if not name or name in PAPER_VIEWS:
        return None
    folded = name.lower().replace("_", "-")
    for key in PAPER_VIEWS:
        if folded == key or folded.startswith(key):
            return key
    close = difflib.get_close_matches(folded, list(PAPER_VIEWS), n=1, cutoff=0.8)
    return close[0] if close else None


def _by_scheme(runs):
    out = OrderedDict()
    for r in runs:
        out.setdefault(r.scheme, []).append(r)
    return out


# --- DeepNet Fig. 4 ----------------------------------------------------------------------------

def update_norm_at(run, update=None):
    """‖ΔF‖ of the logits at `update` (default: the last recorded one), or None."""
    if run.analysis is None:
        return None
    us, vs = run.analysis.series("update_norm", "model", -1, "logits")
    pts = [(u, v) for u, v in zip(us, vs) if u > 0 and v is not None and math.isfinite(v)]
    if not pts:
        return None
    if update is None:
        return pts[-1][1]
    for u, v in pts:
        if u == update:
            return v
    return None


def deepnet_fig4_stats(runs, update=None):
    """{scheme: {"depths": [(depth, ΔF)], "growth": ΔF(deepest) / ΔF(shallowest)}}; ΔF at
    `update` (default each run's last recorded update)."""
    out = OrderedDict()
    for scheme, rs in _by_scheme(runs).items():
        pts = sorted((r.depth_value(), update_norm_at(r, update)) for r in rs)
        pts = [p for p in pts if p[1] is not None and p[1] > 0]
        if not pts:
            continue
        growth = pts[-1][1] / pts[0][1] if len(pts) > 1 else None
        out[scheme] = {"depths": pts, "growth": growth}
    return out


# --- B2T Fig. 3 --------------------------------------------------------------------------------

def start_grad_norms(run, stack, window=START_WINDOW):
    """Per-layer gradient norm (the layer's parameters, sublayer `all`), the mean over the
    recorded updates 1..window: [g_1 … g_L] bottom to top, None where missing."""
    if run.analysis is None:
        return None
    sums, counts = defaultdict(float), defaultdict(int)
    for u, metric, st, layer, sub, value in run.analysis.rows("grad_norm"):
        if st == stack and sub == "all" and 1 <= u <= window and value is not None and math.isfinite(value):
            sums[layer] += value
            counts[layer] += 1
    L = run.enc_layers if stack == "encoder" else run.dec_layers
    return [sums[i] / counts[i] if counts[i] else None for i in range(L)]


def bottom_top_ratio(run, stack="decoder", window=START_WINDOW):
    """g(layer 1) / g(layer L) at the start of training: ≪ 1 is a vanishing gradient toward the
    lower layers (B2T Fig. 3b, Post-LN); ≥ 1 means lower layers get at least the top's."""
    g = start_grad_norms(run, stack, window)
    if not g or g[0] is None or g[-1] is None or g[-1] <= 0:
        return None
    return g[0] / g[-1]


def encoder_decoder_ratio(run, window=START_WINDOW):
    """Geometric mean over layers of g(encoder layer) / g(decoder layer) at the start of training:
    B2T's encoder gradients are ~15× smaller than its decoder's because of the authors' rescaled
    init (every weight matrix × 1/√layers, the decoder's cross-attention k/v too), not of the
    connection (docs/reproducing.md)."""
    enc, dec = start_grad_norms(run, "encoder", window), start_grad_norms(run, "decoder", window)
    pairs = [(e, d) for e, d in zip(enc or [], dec or []) if e and d and e > 0 and d > 0]
    if not pairs:
        return None
    return math.exp(statistics.fmean(math.log(e / d) for e, d in pairs))


def b2t_fig3_stats(runs, window=START_WINDOW):
    """{scheme: {"decoder": geometric mean over runs of bottom/top, "encoder": …}}."""
    out = OrderedDict()
    for scheme, rs in _by_scheme(runs).items():
        row = {}
        for stack in ("encoder", "decoder"):
            vals = [bottom_top_ratio(r, stack, window) for r in rs]
            vals = [v for v in vals if v is not None and v > 0]
            row[stack] = math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None
        out[scheme] = row
    return out


# --- BranchNorm Fig. 4 and Fig. 7 --------------------------------------------------------------

def gnorm_series(run, first=None):
    """(updates, gradient norms before clipping) from train.jsonl, up to update `first`."""
    pts = []
    for t in run.train:
        u, g = t.get("update"), t.get("gnorm")
        if isinstance(u, int) and isinstance(g, (int, float)) and math.isfinite(g) and g > 0:
            if first is None or u <= first:
                pts.append((u, float(g)))
    pts.sort()
    return [p[0] for p in pts], [p[1] for p in pts]


def log_gnorm_roughness(run, first=None):
    """σ(Δ ln‖g‖): the standard deviation of the change of ln‖g‖ from one update to the next over
    the logged updates (consecutive updates only, so log_interval must be 1). It measures how
    jagged the curve is, apart from its trend (BranchNorm Fig. 4: "more smooth"). None with fewer
    than 10 consecutive pairs."""
    us, gs = gnorm_series(run, first)
    diffs = [math.log(gs[i + 1]) - math.log(gs[i]) for i in range(len(us) - 1) if us[i + 1] == us[i] + 1]
    return statistics.pstdev(diffs) if len(diffs) >= 10 else None


def log_gnorm_std(run, first=None):
    """σ(ln‖g‖) over the logged updates: the variance of log‖g‖ itself (trend included)."""
    _, gs = gnorm_series(run, first)
    return statistics.pstdev([math.log(g) for g in gs]) if len(gs) >= 10 else None


def ffn_nonzero(run, update=None):
    """{(stack, layer): share of non-zero FFN ReLU outputs} at `update` (default the last
    recorded), from ffn_nonzero_fraction (else 1 − ffn_zero_fraction)."""
    if run.analysis is None:
        return {}
    for metric, flip in (("ffn_nonzero_fraction", False), ("ffn_zero_fraction", True)):
        ups = run.analysis.updates(metric)
        if ups:
            u = ups[-1] if update is None else run.analysis.nearest_update(metric, update)
            return {(s, l): (1 - v if flip else v) for (s, l, sub), v in run.analysis.at(metric, u).items()
                    if sub == "ffn" and v is not None and math.isfinite(v)}
    return {}


def branchnorm_stats(runs, first=None):
    """{scheme: {"roughness", "log_std", "nonzero_encoder", "nonzero_decoder"}} (means over the
    scheme's runs; the non-zero shares also over the stack's layers)."""
    out = OrderedDict()
    for scheme, rs in _by_scheme(runs).items():
        rough = [x for x in (log_gnorm_roughness(r, first) for r in rs) if x is not None]
        lstd = [x for x in (log_gnorm_std(r, first) for r in rs) if x is not None]
        nz = {stack: [v for r in rs for (s, _), v in ffn_nonzero(r).items() if s == stack]
              for stack in ("encoder", "decoder")}
        out[scheme] = {"roughness": statistics.fmean(rough) if rough else None,
                       "log_std": statistics.fmean(lstd) if lstd else None,
                       "nonzero_encoder": statistics.fmean(nz["encoder"]) if nz["encoder"] else None,
                       "nonzero_decoder": statistics.fmean(nz["decoder"]) if nz["decoder"] else None}
    return out


def sparser_layers(a, b):
    """(layers where run a's non-zero share is below run b's, layers compared)."""
    na, nb = ffn_nonzero(a), ffn_nonzero(b)
    keys = sorted(set(na) & set(nb))
    return sum(1 for k in keys if na[k] < nb[k]), len(keys)


# --- words for the report ------------------------------------------------------------------------

def _f(x, nd=3):
    return "—" if x is None else f"{x:.{nd}g}"


def measured_lines(view, runs):
    """What our runs measured, in the statistic of that view: a list of short lines."""
    if view == "deepnet-fig4":
        lines = []
        for scheme, s in deepnet_fig4_stats(runs).items():
            pts = ", ".join(f"{d}L {_f(v)}" for d, v in s["depths"])
            g = f"; growth deepest/shallowest ×{_f(s['growth'])}" if s["growth"] is not None else ""
            lines.append(f"{scheme}: ‖ΔF‖ at the last update: {pts}{g}")
        return lines
    if view == "b2t-fig3":
        return [f"{scheme}: g(layer 1)/g(top layer) over updates 1–{START_WINDOW}: decoder "
                f"{_f(s['decoder'])}, encoder {_f(s['encoder'])}"
                for scheme, s in b2t_fig3_stats(runs).items()]
    if view == "branchnorm-fig4-fig7":
        lines = [f"{scheme}: σ(Δ ln‖g‖) = {_f(s['roughness'])}, σ(ln‖g‖) = {_f(s['log_std'])}, "
                 f"mean FFN non-zero share: encoder {_f(s['nonzero_encoder'])}, decoder "
                 f"{_f(s['nonzero_decoder'])}" for scheme, s in branchnorm_stats(runs).items()]
        bn = [r for r in runs if r.scheme == "branchnorm"]
        dn = [r for r in runs if r.scheme == "deepnorm"]
        if bn and dn:
            nb, nd = ffn_nonzero(bn[0]), ffn_nonzero(dn[0])
            for stack in ("encoder", "decoder"):
                keys = [k for k in nb if k[0] == stack and k in nd]
                if keys:
                    lines.append(f"{stack}: BranchNorm sparser than DeepNorm in "
                                 f"{sum(nb[k] < nd[k] for k in keys)} of {len(keys)} layers")
        return lines
    return []
