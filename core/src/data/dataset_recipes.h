// The recipes of the named datasets: what is downloaded, how it becomes the dataset's files,
// and which SHA-256 are pinned. Plain data, no network: the manifest loader (and its fuzzer)
// checks data.dataset/data.pair against it; named_datasets.cpp downloads by it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "normlab/data/named_datasets.h"

namespace normlab::data {

// How one download becomes dataset files.
enum class Unpack { Gunzip, Archive };
struct Download {
  std::string url;
  Unpack unpack;
  std::vector<std::pair<std::string, std::string>> members;  // archive path → file (Archive)
  std::string file;                                          // Gunzip: the file it becomes
  // What unpacking may write in all (a few times the real size): a file that unpacks to more is
  // refused before it fills the disk (a 388 kB gzip once wrote 385 MB before its checksum failed).
  uint64_t max_unpacked_bytes = 0;
};

struct Recipe {
  NamedDataset info;
  std::vector<Download> downloads;
  std::map<std::string, std::string> splits;  // "train" → file stem ("train" → train.en / train.de)
};

// file → SHA-256 hex pinned for it in scripts/datasets/NAME.sha256 (a file not listed is
// unverified).
std::map<std::string, std::string> pinned_sums(const std::string& name);

// IWSLT14 members as fairseq's prepare-iwslt14.sh reads them; test = these five in this order.
extern const std::vector<std::string> kIwsltTestSets;

// Throws DataError naming the known ones.
const Recipe& recipe(const std::string& name);

}  // namespace normlab::data
