#!/usr/bin/env python3
"""`normlab data list | fetch | path` and manifests' data.dataset, against local mirrors only.

Multi30k: a mirror of gzip files made from ../shared/data/multi30k (SHA-256 pinned): fetch, path,
a corrupted file (checksum mismatch), a truncated one, a missing one, a resumed partial download,
a manifest that fetches on first use. IWSLT14 and WikiText-2: tiny stand-in archives of the
upstream layout (their checksums are not pinned) exercise unpacking and the fairseq split.
Never touches the network.

usage: check_datasets.py NORMLAB REPO_ROOT WORK_DIR
"""
import gzip
import io
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

normlab, repo, work = (os.path.abspath(a) for a in sys.argv[1:4])
corpus = os.path.join(repo, "..", "shared", "data", "multi30k")
if not os.path.isfile(os.path.join(corpus, "train.en")):
    print("SKIP: %s is absent" % corpus)
    sys.exit(0)
FILES = ["train.en", "train.de", "val.en", "val.de", "test_2016_flickr.en", "test_2016_flickr.de"]
failures = []
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def nl(args, mirror, cache, expect=None):
    env = dict(os.environ, NORMLAB_DATA_DIR=cache, NORMLAB_DATA_MIRROR=mirror)
    p = subprocess.run([normlab] + args, cwd=work, env=env, capture_output=True, text=True)
    if expect is not None and p.returncode != expect:
        print("  exit %d, stdout %r\n  stderr %r" % (p.returncode, p.stdout[-800:], p.stderr[-800:]))
    return p


def make_mirror(name, edit=None):
    d = os.path.join(work, name, "multi30k")
    os.makedirs(d)
    for i, f in enumerate(FILES):
        data = open(os.path.join(corpus, f), "rb").read()
        # Half the files carry their name in the gzip header, as the `gzip` tool writes them
        # (upstream's files do; libarchive then names the entry by it), half do not.
        buf = io.BytesIO()
        with gzip.GzipFile(filename=f if i % 2 == 0 else "", mode="wb", fileobj=buf, mtime=0) as z:
            z.write(data)
        gz = buf.getvalue()
        if edit:
            gz = edit(f, data, gz)
        if gz is not None:
            open(os.path.join(d, f + ".gz"), "wb").write(gz)
    return os.path.join(work, name)


def leftovers(cache):
    return [e for e in (os.listdir(cache) if os.path.isdir(cache) else []) if e not in (".downloads", ".multi30k.lock")]


good = make_mirror("mirror")

# fetch from the mirror folder; the files are the shared corpus, byte for byte
cache = os.path.join(work, "cache")
# the unpack folder of a fetch killed earlier (issue 27.11): removed by the next fetch
stale = os.path.join(cache, ".multi30k.tmp-Ab12Cd")
os.makedirs(stale)
with open(os.path.join(stale, "train.en"), "w") as f:
    f.write("half-unpacked\n")
p = nl(["data", "fetch", "multi30k"], good, cache, 0)
check(not os.path.exists(stale), "a killed fetch's unpack folder is removed by the next fetch")
dest = p.stdout.strip()
check(p.returncode == 0 and all(open(os.path.join(dest, f), "rb").read() == open(os.path.join(corpus, f), "rb").read()
                                for f in FILES), "fetch multi30k from a mirror folder: files identical")
check(not os.path.exists(os.path.join(cache, ".downloads", "multi30k")), "downloads removed once unpacked")
p = nl(["data", "path", "multi30k"], good, cache, 0)
check(p.returncode == 0 and p.stdout.strip() == dest, "path prints the folder")
p = nl(["data", "list"], good, cache, 0)
row = [l for l in p.stdout.splitlines() if l.startswith("multi30k")]
check(p.returncode == 0 and row and " yes " in row[0] and "pinned" in row[0], "list: multi30k present, pinned")
check(all(any(l.startswith(n) for l in p.stdout.splitlines()) for n in ("iwslt14", "wikitext-2", "wikitext-103")),
      "list names iwslt14, wikitext-2, wikitext-103")

# a file:// URL mirror works as well
p = nl(["data", "fetch", "multi30k"], "file://" + good, os.path.join(work, "cache-url"), 0)
check(p.returncode == 0, "fetch from a file:// URL mirror")

# not fetched yet: path exits 1; unknown name: one error line, exit 2
p = nl(["data", "path", "multi30k"], good, os.path.join(work, "empty"))
check(p.returncode == 1 and "not fetched" in p.stderr and p.stdout == "",
      "path of a dataset not fetched: exit 1, nothing on stdout")
p = nl(["data", "fetch", "multi31k"], good, os.path.join(work, "empty"))
check(p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "unknown" in p.stderr,
      "unknown dataset: one error line, exit 2")


def failing(mirror_name, edit, needle, what):
    mirror = make_mirror(mirror_name, edit)
    c = os.path.join(work, "cache-" + mirror_name)
    p = nl(["data", "fetch", "multi30k"], mirror, c)
    errors = [l for l in p.stderr.splitlines() if l.startswith("normlab: error")]
    check(p.returncode == 2 and len(errors) == 1 and needle in errors[0] and not leftovers(c),
          "%s: one error (%s), nothing half-written" % (what, errors[0] if errors else p.stderr.strip()[-200:]))
    return mirror, c


# a changed file: SHA-256 mismatch
failing("bad", lambda f, data, gz: gzip.compress(data + b"extra\n", mtime=0) if f == "val.en" else gz,
        "SHA-256 mismatch", "corrupted file")
# a truncated gzip: unpacking fails
failing("short", lambda f, data, gz: gz[: len(gz) // 2] if f == "train.de" else gz, "truncated or corrupt",
        "truncated download")
# a file missing from the mirror: the download fails
failing("missing", lambda f, data, gz: None if f == "test_2016_flickr.de" else gz,
        "test_2016_flickr.de.gz does not exist", "missing file")
# issue 42.19: a mirror folder that does not exist is the mirror's fault, not a download to resume
c = os.path.join(work, "cache-nomirror")
p = nl(["data", "fetch", "multi30k"], os.path.join(work, "no-such-mirror"), c)
errors = [l for l in p.stderr.splitlines() if l.startswith("normlab: error")]
check(p.returncode == 2 and len(errors) == 1 and "is not a folder" in errors[0] and
      "run again" not in p.stderr and "NORMLAB_DATA_MIRROR=" in errors[0],
      "mirror folder missing: one error naming it (%s)" % (errors[0] if errors else p.stderr.strip()[-200:]))

# a partial download is resumed
c = os.path.join(work, "cache-resume")
part_dir = os.path.join(c, ".downloads", "multi30k")
os.makedirs(part_dir)
gz = open(os.path.join(good, "multi30k", "train.en.gz"), "rb").read()
open(os.path.join(part_dir, "train.en.gz.part"), "wb").write(gz[: len(gz) // 3])
p = nl(["data", "fetch", "multi30k"], good, c, 0)
check(p.returncode == 0 and "resuming after" in p.stderr and
      open(os.path.join(p.stdout.strip(), "train.en"), "rb").read() == open(os.path.join(corpus, "train.en"), "rb").read(),
      "partial download resumed")

# a manifest names the dataset: fetched on first use, then trained on
c = os.path.join(work, "cache-manifest")
open(os.path.join(work, "m30k.toml"), "w").write(
    '[model]\narch = "encdec"\nd_model = 16\nffn_dim = 32\nheads = 2\nenc_layers = 1\ndec_layers = 1\n'
    'share_embeddings = "all"\n[data]\ndataset = "multi30k"\npair = "de-en"\nmax_len = 64\ncache_dir = "spm"\n'
    '[data.tokenizer]\nvocab_size = 300\nmodel_type = "word"\n'
    '[optim]\nmax_updates = 1\nmax_tokens = 512\n[eval]\nbleu = false\n[run]\nout_dir = "runs/m30k"\nthreads = 1\n')
p = nl(["train", "m30k.toml"], good, c, 0)
check(p.returncode == 0 and "dataset multi30k: ready" in p.stdout + p.stderr, "data.dataset fetched on first use, trained")
for bad, needle in (('pair = "fr-en"', "[data] pair: dataset \"multi30k\" has en-de or de-en"), ('task = "lm"', "is a translation dataset"),
                    ('train_src = "m30k.toml"', "not with dataset")):
    open(os.path.join(work, "bad.toml"), "w").write(
        '[data]\ndataset = "multi30k"\n%s\n[run]\nout_dir = "runs/bad"\n' % bad)
    p = nl(["train", "bad.toml"], good, c)
    check(p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          "manifest %s: one error line (%s)" % (bad, p.stderr.strip()))


# IWSLT14 and WikiText-2: stand-in archives with the upstream member names (not pinned: warning)
def tar_add(tar, name, text):
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


mirror = os.path.join(work, "mirror-other")
os.makedirs(os.path.join(mirror, "iwslt14"))
os.makedirs(os.path.join(mirror, "wikitext-2"))
with tarfile.open(os.path.join(mirror, "iwslt14", "de-en.tgz"), "w:gz") as tar:
    for lang in ("de", "en"):
        lines = ["<url>http://x</url>", "<talkid>1</talkid>", "<title>Titel %s</title>" % lang]
        lines += ["satz %d %s" % (i, lang) if i != 5 else ("ein sehr langer satz " * 3 if lang == "de" else "short")
                  for i in range(60)]
        tar_add(tar, "de-en/train.tags.de-en.%s" % lang, "\n".join(lines) + "\n")
        for t in ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                  "IWSLT14.TED.tst2012"):
            tar_add(tar, "de-en/%s.de-en.%s.xml" % (t, lang),
                    '<doc>\n<seg id="1"> %s one </seg>\n<seg id="2">it\u2019s %s</seg>\n</doc>\n' % (t, lang))
with zipfile.ZipFile(os.path.join(mirror, "wikitext-2", "wikitext-2-raw-v1.zip"), "w") as z:
    for split in ("train", "valid", "test"):
        z.writestr("wikitext-2-raw/wiki.%s.raw" % split, " = Heading = \n text of %s \n" % split)
c = os.path.join(work, "cache-other")
p = nl(["data", "fetch", "iwslt14"], mirror, c, 0)
d = p.stdout.strip()
if p.returncode == 0:
    rd = lambda f: open(os.path.join(d, f), encoding="utf-8").read().splitlines()
    # 60 pairs kept (the title line stays, tags stripped; pair 5 fails the 1.5 length ratio): every 23rd is valid
    check(len(rd("train.de")) == 58 and len(rd("valid.de")) == 2 and rd("valid.en")[0] == "satz 22 en" and
          rd("train.de")[0] == "Titel de" and len(rd("test.en")) == 10 and rd("test.en")[1] == "it's en" and
          "unverified" in p.stderr, "iwslt14: fairseq split of a stand-in archive, unverified warning")
else:
    check(False, "iwslt14 fetch: %s" % p.stderr.strip())
p = nl(["data", "fetch", "wikitext-2"], mirror, c, 0)
check(p.returncode == 0 and open(os.path.join(p.stdout.strip(), "wiki.valid.raw")).read() == " = Heading = \n text of valid \n",
      "wikitext-2: unpacked from a stand-in zip")

# Issue 27.7, 27.12-14: downloads that can always finish, mirrors of any folder name and of plain
# files, archives checked member by member and by size, installed files checked on use.
def same_as_corpus(dest):
    return all(open(os.path.join(dest, f), "rb").read() == open(os.path.join(corpus, f), "rb").read() for f in FILES)


c = os.path.join(work, "cache-part")
os.makedirs(os.path.join(c, ".downloads", "multi30k"))
with open(os.path.join(c, ".downloads", "multi30k", "train.en.gz.part"), "wb") as f:
    f.write(b"x" * (os.path.getsize(os.path.join(good, "multi30k", "train.en.gz")) + 1000))
p = nl(["data", "fetch", "multi30k"], good, c, 0)
check(p.returncode == 0 and same_as_corpus(p.stdout.strip()) and "starting over" in p.stderr,
      "a partial download longer than the file is discarded and fetched again (%s)" % p.stderr.strip()[-200:])

plain = os.path.join(work, "mirror plain %2Fx")  # a space and %2F in the folder name; plain files
os.makedirs(os.path.join(plain, "multi30k"))
for f in FILES:
    shutil.copyfile(os.path.join(corpus, f), os.path.join(plain, "multi30k", f))
p = nl(["data", "fetch", "multi30k"], plain, os.path.join(work, "cache-plain"), 0)
check(p.returncode == 0 and same_as_corpus(p.stdout.strip()) and ": 0 B" not in p.stderr,
      "a mirror folder of plain files, with a space and %%2F in its name; no \"0 B\" progress (%s)" % p.stderr.strip()[-200:])

bomb = make_mirror("mirror-bomb", lambda f, data, gz: gzip.compress(bytes(40 << 20), mtime=0) if f == "train.en" else gz)
p = nl(["data", "fetch", "multi30k"], bomb, os.path.join(work, "cache-bomb"))
check(p.returncode == 2 and "unpacks to more than" in p.stderr and
      not os.path.exists(os.path.join(work, "cache-bomb", "multi30k")),
      "a gzip that unpacks far beyond the file's size is stopped (%s)" % p.stderr.strip()[-200:])

d = nl(["data", "path", "multi30k"], good, cache).stdout.strip()
with open(os.path.join(d, "train.en"), "r+b") as f:
    f.truncate(1000)
p = nl(["data", "fetch", "multi30k"], good, cache)
check(p.returncode == 2 and "train.en is 1000 bytes" in p.stderr and "fetch it again" in p.stderr,
      "a truncated installed file is refused on use (%s)" % p.stderr.strip()[-200:])

twice = os.path.join(work, "mirror-twice", "iwslt14")
os.makedirs(twice)
with tarfile.open(os.path.join(twice, "de-en.tgz"), "w:gz") as tar:
    tar_add(tar, "de-en/train.tags.de-en.de", "a\n")
    tar_add(tar, "de-en/train.tags.de-en.de", "b\n")
p = nl(["data", "fetch", "iwslt14"], os.path.dirname(twice), os.path.join(work, "cache-twice"))
check(p.returncode == 2 and "member de-en/train.tags.de-en.de appears twice" in p.stderr,
      "an archive with a member twice names it (%s)" % p.stderr.strip()[-200:])

link = os.path.join(work, "mirror-link", "wikitext-2")
os.makedirs(link)
with zipfile.ZipFile(os.path.join(link, "wikitext-2-raw-v1.zip"), "w") as z:
    for split in ("train", "valid"):
        z.writestr("wikitext-2-raw/wiki.%s.raw" % split, " = Heading = \n")
    info = zipfile.ZipInfo("wikitext-2-raw/wiki.test.raw")
    info.create_system = 3
    info.external_attr = (0o120777 << 16)  # a symbolic link, to /etc/passwd
    z.writestr(info, "/etc/passwd")
p = nl(["data", "fetch", "wikitext-2"], os.path.dirname(link), os.path.join(work, "cache-link"))
check(p.returncode == 2 and "wiki.test.raw is not a regular file" in p.stderr,
      "an archive member that is a symbolic link is refused (%s)" % p.stderr.strip()[-200:])

wrong = os.path.join(work, "mirror-wrong", "iwslt14")
os.makedirs(wrong)
with tarfile.open(os.path.join(wrong, "de-en.tgz"), "w:gz") as tar:
    names = ["de-en/train.tags.de-en.%s" % l for l in ("de", "en")] + [
        "de-en/%s.de-en.%s.xml" % (t, l) for l in ("de", "en") for t in
        ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011", "IWSLT14.TED.tst2012")]
    for n in names:
        tar_add(tar, n, "one line\n" if n.endswith(".de") else "one\ntwo\n")  # German and English disagree
cw = os.path.join(work, "cache-wrong")
p = nl(["data", "fetch", "iwslt14"], os.path.dirname(wrong), cw)
check(p.returncode == 2 and "removed the download" in p.stderr and not os.path.exists(os.path.join(cw, ".downloads", "iwslt14")),
      "a readable download with the wrong content is removed, not reused (%s)" % p.stderr.strip()[-200:])

# Downloaded bytes start no programs (issue 27.9): libarchive's lzop/lrzip/… filters run `lzop -d`
# etc. from PATH; only the filters the catalogue needs (gzip) are enabled.
mirror = os.path.join(work, "mirror-lzop")
os.makedirs(os.path.join(mirror, "iwslt14"))
with open(os.path.join(mirror, "iwslt14", "de-en.tgz"), "wb") as f:
    f.write(b"\x89LZO\x00\r\n\x1a\n" + bytes(200))
bin_dir = os.path.join(work, "fake-bin")
os.makedirs(bin_dir, exist_ok=True)
ran = os.path.join(work, "DECOMPRESSOR-RAN")
for prog in ("lzop", "lrzip", "lz4", "zstd", "xz", "bzip2", "lzma", "grzip", "lrz", "uudecode"):
    with open(os.path.join(bin_dir, prog), "w") as f:
        f.write("#!/bin/sh\ntouch '%s'\ncat\n" % ran)
    os.chmod(os.path.join(bin_dir, prog), 0o755)
env = dict(os.environ, NORMLAB_DATA_DIR=os.path.join(work, "cache-lzop"), NORMLAB_DATA_MIRROR=mirror,
           PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
p = subprocess.run([normlab, "data", "fetch", "iwslt14"], cwd=work, env=env, capture_output=True, text=True)
check(p.returncode != 0 and not os.path.exists(ran),
      "an lzop-compressed download runs no program from PATH (%s)" % p.stderr.strip()[:200])

# tinyshakespeare: one plain (not gzipped) file, from ../shared/data itself as the mirror; a
# data.dataset run validates on the last 10 % of its lines.
shared = os.path.join(repo, "..", "shared", "data")
c = os.path.join(work, "cache-shakespeare")
p = nl(["data", "fetch", "tinyshakespeare"], shared, c, 0)
dest = os.path.join(c, "tinyshakespeare", "input.txt")
check(p.returncode == 0 and os.path.exists(dest) and open(dest, "rb").read() ==
      open(os.path.join(shared, "tinyshakespeare", "input.txt"), "rb").read(), "tinyshakespeare: fetched, pinned bytes")
lm_dir = os.path.join(work, "shakespeare-run")
os.makedirs(lm_dir, exist_ok=True)
with open(os.path.join(lm_dir, "m.toml"), "w") as f:
    f.write('[model]\narch = "lm"\nfamily = "llama"\nd_model = 16\nheads = 2\ndec_layers = 1\n'
            '[data]\ndataset = "tinyshakespeare"\nlm_block = 64\ncache_dir = "spm"\n'
            '[data.tokenizer]\nmodel_type = "bpe"\nvocab_size = 300\n'
            '[optim]\nmax_updates = 2\nmax_tokens = 256\n[eval]\ninterval = 0\n[run]\nout_dir = "runs/shakespeare"\n')
p = subprocess.run([normlab, "train", "m.toml"], cwd=lm_dir, capture_output=True, text=True,
                   env=dict(os.environ, NORMLAB_DATA_DIR=c, NORMLAB_DATA_MIRROR=shared))
check(p.returncode == 0 and "the last 10% of the train file's lines: 4000 of 40000" in p.stdout + p.stderr,
      "data.dataset = tinyshakespeare trains; validation = the last 4,000 of 40,000 lines (%s)" % (p.stdout + p.stderr)[-300:])

if failures:
    print("datasets check FAILED: %d" % len(failures))
    sys.exit(1)
print("datasets check OK")
