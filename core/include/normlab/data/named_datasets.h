// Datasets by name (`normlab data list | fetch | path`, manifests' data.dataset): downloaded with
// libcurl (resumable, with progress), SHA-256 checked against scripts/datasets/NAME.sha256 (built
// in), unpacked into the data cache and renamed into place only when complete. No LibTorch here.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

namespace normlab::data {

struct DataConfig;

struct NamedDataset {
  std::string name;                // multi30k, iwslt14, wikitext-2, wikitext-103
  std::string task;                // translation | lm
  std::string description;         // one line
  std::string source;              // where the files come from (paper, upstream)
  std::vector<std::string> urls;   // what is downloaded
  std::vector<std::string> files;  // what the dataset folder holds
  std::vector<std::string> pairs;  // translation: "en-de" …, the first is the default
  bool verified = false;           // every file's SHA-256 is pinned in the repo
};

const std::vector<NamedDataset>& named_datasets();
// Throws DataError naming the known ones.
const NamedDataset& named_dataset(const std::string& name);

// Where named datasets live: $NORMLAB_DATA_DIR, else ~/.cache/normlab/data/datasets.
std::filesystem::path datasets_root();
// <root>/NAME; complete only when fetched (holds SHA256SUMS).
std::filesystem::path dataset_dir(const std::string& name);
bool dataset_present(const std::string& name);

// Downloads (from $NORMLAB_DATA_MIRROR when set), verifies and unpacks NAME unless it is present;
// returns its folder. Progress and warnings go to `log`. Throws DataError (one line); a failure
// leaves no dataset folder (a partial download stays in <root>/.downloads to be resumed).
std::filesystem::path fetch_dataset(const std::string& name, std::ostream& log);

// A manifest's data.dataset (and data.pair): fetches it on first use and fills the file paths
// and the task. Throws DataError.
void resolve_named_dataset(DataConfig& cfg, std::ostream& log);

}  // namespace normlab::data
