# Sourced by the GPU checks (cuda_manifests.sh, cuda_graph.sh) after `set -euo pipefail` and
# normlab=… work=…: a fresh work directory to run in, "SKIP: …" and exit where no CUDA device is
# usable (a build without CUDA, or no device), and losses FILE: update and loss of a train.jsonl's
# train records, one per line.
rm -rf "$work" && mkdir -p "$work"
cd "$work"
cuda_line=$("$normlab" --version | grep '^CUDA')
case "$cuda_line" in
  "CUDA no"*) echo "SKIP: ${cuda_line#CUDA }"; exit 0 ;;
esac

losses() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    j = json.loads(l)
    if j["kind"] == "train": print(j["update"], repr(j["loss"]))' "$1"; }
