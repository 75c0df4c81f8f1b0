# Sourced by the tutorial tests: readme_block NAME PAGE OUT writes to OUT the sh block of the Markdown
# file PAGE (a docs/ page) between <!-- NAME:begin --> and <!-- NAME:end --> (the lines strictly
# inside its ``` fences).
readme_block() {
  local name=$1 readme=$2 out=$3
  awk -v b="<!-- $name:begin -->" -v e="<!-- $name:end -->" \
      '$0 == b {on = 1; next} $0 == e {on = 0} on' "$readme" > "$out.md"
  [ "$(head -n 1 "$out.md")" = '```sh' ] || { echo "FAIL: $readme: no \`\`\`sh block right after <!-- $name:begin -->" >&2; exit 1; }
  [ "$(tail -n 1 "$out.md")" = '```' ] || { echo "FAIL: $readme: the $name block does not end with \`\`\` right before <!-- $name:end -->" >&2; exit 1; }
  sed '1d;$d' "$out.md" > "$out"
  [ -s "$out" ] || { echo "FAIL: $readme: the $name block is empty" >&2; exit 1; }
}
