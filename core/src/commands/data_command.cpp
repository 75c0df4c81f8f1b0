// `normlab data list | fetch NAME | path NAME`: the named datasets (normlab/data/named_datasets.h).
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <ostream>

#include "data/tokenize_corpus.h"
#include "normlab/data/dataset.h"
#include "normlab/data/named_datasets.h"
#include "normlab/interop_commands.h"
#include "util/atomic_file.h"
#include "util/owned_dir.h"

namespace normlab {

int data_command(const DataOptions& opt, std::ostream& out, std::ostream& err) {
  try {
    if (opt.action == "list") {
      size_t w = 4;  // the longest name (tinyshakespeare overflowed a fixed 13)
      for (const auto& d : data::named_datasets()) w = std::max(w, std::string(d.name).size());
      fmt::print(out, "{:<{}} {:<11} {:<8} {:<10} {}\n", "NAME", w, "TASK", "PRESENT", "SHA-256",
                 "DESCRIPTION");
      for (const auto& d : data::named_datasets())
        fmt::print(out, "{:<{}} {:<11} {:<8} {:<10} {}\n", d.name, w, d.task,
                   data::dataset_present(d.name) ? "yes" : "no", d.verified ? "pinned" : "unpinned",
                   d.description);
      fmt::print(out, "folder: {}{}\n", data::datasets_root().string(),
                 std::getenv("NORMLAB_DATA_MIRROR")
                     ? fmt::format(" (mirror: {})", std::getenv("NORMLAB_DATA_MIRROR"))
                     : "");
      return 0;
    }
    if (opt.action == "tokenize") {
      data::TokenizeOptions t;
      t.inputs = opt.inputs;
      t.out = opt.out;
      t.model = opt.model;
      t.vocab_size = opt.vocab_size;
      t.model_type = opt.model_type;
      t.sample_lines = opt.sample_lines;
      t.sample_seed = opt.sample_seed;
      t.jsonl_field = opt.jsonl_field;
      t.jobs = opt.jobs;
      t.word_cache = opt.word_cache;
      t.max_line_bytes = opt.max_line_bytes;
      t.piece_bytes = opt.piece_mb << 20;
      t.documents = opt.documents;
      t.keep_newlines = opt.keep_newlines;
      t.cache_dir = opt.cache_dir;
      data::tokenize_to_shards(t, err, isatty(STDERR_FILENO) != 0);
      return 0;
    }
    if (opt.action == "fetch") {
      fmt::print(out, "{}\n", data::fetch_dataset(opt.name, err).string());
      return 0;
    }
    // path: where it is, fetched or not (exit 1 when absent, so scripts can test it)
    // Nothing on stdout then: `cd "$(normlab data path X)"` must not land in a missing folder.
    const auto dir = data::dataset_dir(opt.name);
    if (!data::dataset_present(opt.name)) {
      fmt::print(err, "normlab: dataset {} is not fetched yet into {} (normlab data fetch {})\n",
                 opt.name, dir.string(), opt.name);
      return 1;
    }
    fmt::print(out, "{}\n", dir.string());
    return 0;
  } catch (const data::TokenizeBusyError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
    return 75;  // EX_TEMPFAIL, as train's kExitBusy
  } catch (const data::DataError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
    return 2;
  } catch (const util::DirectoryClaimError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
    return 2;
  } catch (const util::FileError& e) {
    fmt::print(err, "normlab: error: {}\n", e.what());
    return 1;
  }
}

}  // namespace normlab
