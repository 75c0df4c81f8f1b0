"""`normlab plugins show --json` read back by Python's json module and checked against the
papers' formulas computed here."""
import json
import math
import subprocess
import sys

exe = sys.argv[1]


def show(*args):
    out = subprocess.run([exe, "plugins", "show", *args, "--json"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def derived(doc, name, where):
    for d in doc["derived"]:
        if d["name"] == name and d["where"] == where:
            return d["value"]
    raise AssertionError(f"{doc['name']}: no derived {name} @ {where}")


def close(a, b):
    assert math.isclose(a, b, rel_tol=1e-12), (a, b)


N, M = 12, 3
d = show("deepnorm", "--enc-layers", str(N), "--dec-layers", str(M))
close(derived(d, "alpha", "encoder"), 0.81 * (N**4 * M) ** (1 / 16))
close(derived(d, "beta", "encoder"), 0.87 * (N**4 * M) ** (-1 / 16))
close(derived(d, "alpha", "decoder"), (3 * M) ** 0.25)
close(derived(d, "beta", "decoder"), (12 * M) ** -0.25)
assert d["params"][0] == {"name": "torchscale_compat", "type": "bool", "default": False,
                          "help": d["params"][0]["help"]}
lm = show("deepnorm", "--arch", "lm", "--dec-layers", "24")
close(derived(lm, "alpha", "decoder"), (2 * 24) ** 0.25)

# The SDK 2 schemes (docs/schemes/magneto.md, mix_ln.md, ln_scaling.md, dyt.md).
mg = show("magneto", "--enc-layers", "6", "--dec-layers", "6")
close(derived(mg, "gamma", "encoder"), math.sqrt(math.log(3 * 6) * math.log(2 * 6) / 3))
close(derived(mg, "gamma", "decoder"), math.sqrt(math.log(3 * 6)))
close(derived(show("magneto", "--arch", "lm", "--dec-layers", "12"), "gamma", "decoder"), math.sqrt(math.log(24)))
assert derived(show("mix-ln", "--arch", "lm", "--dec-layers", "24"), "post_ln_layers", "decoder") == 24 // 4
close(derived(show("ln-scaling", "--arch", "lm", "--dec-layers", "6"), "scale", "decoder layer 6"), 1 / math.sqrt(6))
dy = show("dyt", "--param", "alpha0_ffn=0.2")
close(derived(dy, "alpha0", "ffn inputs"), 0.2)
close(derived(dy, "alpha0", "attention inputs"), 0.5)

a = show("admin", "--enc-layers", "6", "--dec-layers", "6")
n = 12
close(derived(a, "omega O(logn)", "encoder (n=12)"), math.sqrt((n + 1) / math.log(n + 1) - 1))
n = 18
close(derived(a, "omega O(1)", "decoder (n=18)"), math.sqrt(n))

b = show("branchnorm", "--param", "T=1000", "--param", "schedule=exp")
close(derived(b, "alpha_t", "t=250"), (math.exp(5 * 0.25) - 1) / (math.exp(5) - 1))
assert {p["name"] for p in b["params"]} == {"schedule", "T", "k", "alpha_min"}

# Stream schemes (default geometry: d_model 512, 8 heads).
r = show("residual")
close(derived(r, "final_ln_eps", "each stack"), 1e-7)
h = show("hyper-connections", "--param", "n=3")
close(derived(h, "params_per_sublayer", "static"), 3 + 9 + 3)
close(derived(show("hyper-connections-dynamic"), "s_alpha", "init"), 0.01)
m = show("mhc", "--param", "n=5")
close(derived(m, "b_pre", "init"), math.log((2 / 30) / (1 - 2 / 30)))  # sigma = 2(j+1)/(n(n+1)), j = 0
close(derived(m, "H_res", "init"), 1 / 5)
close(derived(m, "t_max", "Sinkhorn-Knopp"), 20)
g = show("ngpt")
close(derived(g, "alpha", "init"), 0.05)
close(derived(g, "alpha_scale", "stored init"), 1 / math.sqrt(512))
close(derived(g, "softmax_scale", "attention"), math.sqrt(512 / 8))
# The text form's derived table (issue 27.15): four headed columns, every value right-aligned under
# VALUE, for a scheme whose "where" entries are longer than the old fixed column.
for scheme in ("dyt", "mhc", "deepnorm"):
    text = subprocess.run([exe, "plugins", "show", scheme], check=True, capture_output=True,
                          text=True).stdout.splitlines()
    head = next(i for i, line in enumerate(text) if line.startswith("derived for"))
    header, rows = text[head + 1], [r for r in text[head + 2:] if r.strip()]
    assert header.split() == ["NAME", "WHERE", "VALUE", "FORMULA"], header
    right = header.index("VALUE") + len("VALUE")
    doc = show(scheme)
    assert len(rows) == len(doc["derived"]), (rows, doc["derived"])
    for row, d in zip(rows, doc["derived"]):
        value = row[:right].split()[-1]
        assert row[right] == " " and math.isclose(float(value), d["value"], rel_tol=1e-5), (header, row)
print("plugins show --json: all derived values match the formulas; the text table is aligned")
