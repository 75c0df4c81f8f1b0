#include <fmt/format.h>

#include <sstream>

#include "data/dataset_recipes.h"
#include "normlab/data/dataset.h"

namespace normlab::data {
namespace {

// scripts/datasets/NAME.sha256, compiled in by CMake: {name, "hex  file\n…"}.
const std::map<std::string, std::string>& pin_texts() {
  static const std::map<std::string, std::string> pins = {
#include "dataset_pins.inc"
  };
  return pins;
}

}  // namespace

// file → SHA-256 hex pinned for it ('#' lines are comments; a file not listed is unverified).
std::map<std::string, std::string> pinned_sums(const std::string& name) {
  std::map<std::string, std::string> out;
  auto it = pin_texts().find(name);
  if (it == pin_texts().end()) return out;
  std::istringstream in(it->second);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string hex, file;
    if (ls >> hex >> file) out[file] = hex;
  }
  return out;
}

namespace {

const char* const kMulti30k =
    "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/";
const char* const kIwslt14 = "https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz";
const char* const kWikitext = "https://wikitext.smerity.com/";
const char* const kTinyShakespeare =
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt";

std::vector<Recipe> make_recipes() {
  std::vector<Recipe> out;
  {
    Recipe r;
    r.info = {"multi30k",
              "translation",
              "Multi30k task 1 En-De: train 29,000, valid 1,014, test2016 1,000 pairs",
              "Elliott et al. 2016; github.com/multi30k/dataset data/task1/raw",
              {},
              {},
              {"en-de", "de-en"}};
    for (const char* stem : {"train", "val", "test_2016_flickr"})
      for (const char* lang : {"en", "de"}) {
        const std::string file = fmt::format("{}.{}", stem, lang);
        // The largest file (train.de) is 2.1 MB.
        r.downloads.push_back(
            {std::string(kMulti30k) + file + ".gz", Unpack::Gunzip, {}, file, 32ull << 20});
        r.info.files.push_back(file);
      }
    r.splits = {{"train", "train"}, {"valid", "val"}, {"test", "test_2016_flickr"}};
    out.push_back(std::move(r));
  }
  {
    Recipe r;
    r.info = {"iwslt14",
              "translation",
              "IWSLT14 De-En, the fairseq split (valid = every 23rd training pair; test = dev2010, "
              "dev2012, tst2010-2012), raw text",
              "Cettolo et al. 2014 (WIT3); fairseq examples/translation/prepare-iwslt14.sh",
              {},
              {},
              {"de-en", "en-de"}};
    Download d{kIwslt14, Unpack::Archive, {}, "", 1ull << 30};  // the members: about 70 MB
    for (const char* lang : {"de", "en"}) {
      d.members.push_back({fmt::format("de-en/train.tags.de-en.{}", lang),
                           fmt::format("orig/train.tags.de-en.{}", lang)});
      for (const auto& t : kIwsltTestSets)
        d.members.push_back({fmt::format("de-en/{}.de-en.{}.xml", t, lang),
                             fmt::format("orig/{}.{}.xml", t, lang)});
    }
    r.downloads.push_back(d);
    for (const char* stem : {"train", "valid", "test"})
      for (const char* lang : {"de", "en"})
        r.info.files.push_back(fmt::format("{}.{}", stem, lang));
    r.splits = {{"train", "train"}, {"valid", "valid"}, {"test", "test"}};
    out.push_back(std::move(r));
  }
  for (const char* size : {"2", "103"}) {
    Recipe r;
    const std::string name = fmt::format("wikitext-{}", size);
    r.info = {name,
              "lm",
              fmt::format("WikiText-{} raw (wiki.train/valid/test.raw)", size),
              "Merity et al. 2016, Pointer Sentinel Mixture Models",
              {},
              {},
              {}};
    // WikiText-103's three files: 540 MB; WikiText-2's: 13 MB.
    Download d{fmt::format("{}wikitext-{}-raw-v1.zip", kWikitext, size),
               Unpack::Archive,
               {},
               "",
               std::string(size) == "2" ? 256ull << 20 : 4ull << 30};
    for (const char* split : {"train", "valid", "test"}) {
      const std::string file = fmt::format("wiki.{}.raw", split);
      d.members.push_back({fmt::format("wikitext-{}-raw/{}", size, file), file});
      r.info.files.push_back(file);
    }
    r.downloads.push_back(d);
    r.splits = {
        {"train", "wiki.train.raw"}, {"valid", "wiki.valid.raw"}, {"test", "wiki.test.raw"}};
    out.push_back(std::move(r));
  }
  {
    // One file, no official split: validation is the last data.lm_valid_fraction (0.1) of its
    // lines.
    Recipe r;
    r.info = {"tinyshakespeare",
              "lm",
              "Tiny Shakespeare, 40,000 lines (1.1 MB); no official split: the first 90 % of the "
              "lines train, "
              "the last 10 % validate (data.lm_valid_fraction)",
              "Karpathy 2015, github.com/karpathy/char-rnn data/tinyshakespeare",
              {},
              {},
              {}};
    // A plain file: the gzip reader passes uncompressed bytes through.
    r.downloads.push_back({kTinyShakespeare, Unpack::Gunzip, {}, "input.txt", 8ull << 20});
    r.info.files.push_back("input.txt");
    r.splits = {{"train", "input.txt"}, {"valid", ""}, {"test", ""}};
    out.push_back(std::move(r));
  }
  for (auto& r : out) {
    for (const auto& d : r.downloads) r.info.urls.push_back(d.url);
    const auto pins = pinned_sums(r.info.name);
    r.info.verified = true;
    for (const auto& f : r.info.files) r.info.verified = r.info.verified && pins.count(f);
  }
  return out;
}

const std::vector<Recipe>& recipes() {
  static const std::vector<Recipe> r = make_recipes();
  return r;
}

}  // namespace

// IWSLT14 members as fairseq's prepare-iwslt14.sh reads them; test = these five in this order.
const std::vector<std::string> kIwsltTestSets = {"IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012",
                                                 "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                                                 "IWSLT14.TED.tst2012"};

const Recipe& recipe(const std::string& name) {
  for (const auto& r : recipes())
    if (r.info.name == name) return r;
  std::string known;
  for (const auto& r : recipes()) known += (known.empty() ? "" : ", ") + r.info.name;
  throw DataError(fmt::format("dataset '{}': unknown (expected one of: {})", name, known));
}

const std::vector<NamedDataset>& named_datasets() {
  static const std::vector<NamedDataset> out = [] {
    std::vector<NamedDataset> v;
    for (const auto& r : recipes()) v.push_back(r.info);
    return v;
  }();
  return out;
}

const NamedDataset& named_dataset(const std::string& name) { return recipe(name).info; }

}  // namespace normlab::data
