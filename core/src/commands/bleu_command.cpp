#include <fmt/format.h>
#include <fmt/ostream.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <stdexcept>

#include "commands/commands.h"
#include "normlab/eval/bleu.h"
#include "normlab/eval/chrf.h"

namespace normlab {
namespace {

// Lines split at '\n' with a trailing '\r' dropped (what Python's universal newlines give for
// '\n' and '\r\n' files); a final newline does not start another line.
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot read '{}'", path));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

}  // namespace

int bleu(const BleuOptions& opt, std::ostream& out) {
  if (!opt.tokenize_13a.empty()) {
    for (const auto& line : read_lines(opt.tokenize_13a)) out << eval::tokenize_13a(line) << '\n';
    return 0;
  }
  if (opt.hyp.empty() || opt.ref.empty()) throw std::invalid_argument("bleu needs --hyp and --ref");
  const auto hyp = read_lines(opt.hyp), ref = read_lines(opt.ref);
  if (hyp.size() != ref.size())
    throw std::runtime_error(
        fmt::format("'{}' has {} lines but '{}' has {}", opt.hyp, hyp.size(), opt.ref, ref.size()));
  const eval::BleuScore s = eval::corpus_bleu(hyp, ref);
  if (opt.json) {
    nlohmann::json j;
    j["score"] = s.score;
    j["counts"] = s.counts;
    j["totals"] = s.totals;
    j["precisions"] = s.precisions;
    j["bp"] = s.brevity_penalty;
    j["sys_len"] = s.sys_len;
    j["ref_len"] = s.ref_len;
    j["text"] = s.to_string();
    j["signature"] = eval::bleu_signature();
    const eval::ChrfScore chrf = eval::corpus_chrf(hyp, ref);
    j["chrf"] = chrf.score;
    j["chrf_stats"] = chrf.stats;
    j["chrf_signature"] = eval::chrf_signature();
    out << j.dump() << '\n';
  } else {
    out << s.to_string() << '\n';
  }
  return 0;
}

}  // namespace normlab
