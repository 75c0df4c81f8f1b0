// LM data at research scale (issue 44): token shards through mmap, a seeded block order computed
// per batch, batches made ahead on a thread, a resume on the same batches, disjoint rank shares.
// The formats written by numpy as their tools write them: tests/check_token_shards.py.
#include <fmt/format.h>
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <tuple>

#include "data/token_shards.h"
#include "interrupt_at.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "test_support.h"
#include "train/batch_prefetch.h"
#include "util/safetensors.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_lm_shards {

using namespace normlab;
using namespace normlab::test;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// nanoGPT's layout: the tokens as little-endian uint16, nothing else.
fs::path write_nanogpt(const fs::path& file, int64_t n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = uint16_t(rng() % uint32_t(vocab));
  std::ofstream(file, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(n * 2));
  return file;
}

}  // namespace

TEST_SUITE("lm_shards") {
  TEST_CASE("the seeded block order is a permutation, another one per seed, without a table") {
    for (uint64_t n : {1ULL, 2ULL, 3ULL, 17ULL, 1000ULL, 4097ULL}) {
      CAPTURE(n);
      const data::SeededPermutation p(n, 7), q(n, 8);
      std::set<uint64_t> seen;
      int moved = 0, differ = 0;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t j = p.at(i);
        CHECK(j < n);
        seen.insert(j);
        moved += j != i;
        differ += j != q.at(i);
      }
      CHECK(seen.size() == n);
      if (n >= 17) {
        CHECK(moved > int(n) / 2);  // not the identity
        CHECK(differ > int(n) / 2);
      }
    }
  }

  // Issue 59.12: peak RSS grew with run length through the mapped pages a run had read (RssFile
  // 240 → 420 MB at 100 → 300 updates).
  TEST_CASE("reading a whole shard through its mapping leaves at most ~64 MiB of it resident") {
    const fs::path d = fresh_dir("normlab_shards", "rss");
    const int64_t tokens = int64_t(96) << 20;  // 192 MiB of uint16
    {
      std::ofstream f(d / "big.bin", std::ios::binary);
      std::vector<uint16_t> block(size_t(1) << 20, 7);
      for (int64_t i = 0; i < tokens; i += int64_t(block.size()))
        f.write(reinterpret_cast<const char*>(block.data()), std::streamsize(block.size() * 2));
    }
    auto rss_file_kb = [] {
      std::ifstream in("/proc/self/status");
      for (std::string line; std::getline(in, line);)
        if (line.rfind("RssFile:", 0) == 0) return int64_t(std::stoll(line.substr(8)));
      return int64_t(-1);
    };
    const int64_t before = rss_file_kb();
    REQUIRE(before >= 0);
    auto stream =
        data::TokenStream::open("data.train", {d / "big.bin"}, data::ShardFormat::NanoGpt);
    std::vector<int32_t> out(size_t(1) << 16);
    int64_t peak = 0;
    for (int64_t at = 0; at + int64_t(out.size()) <= tokens; at += int64_t(out.size())) {
      stream->read(at, int64_t(out.size()), out.data());
      REQUIRE(out.back() == 7);
      if (at % (int64_t(1) << 22) == 0) peak = std::max(peak, rss_file_kb() - before);
    }
    peak = std::max(peak, rss_file_kb() - before);
    CAPTURE(peak);
    CHECK(peak < 100 * 1024);  // KiB: the 64 MiB drop threshold and slack, not the 192 MiB read
    fs::remove_all(d);
  }

  TEST_CASE("an epoch of shard batches takes every block once; ranks take disjoint shares") {
    const fs::path d = fresh_dir("normlab_shards", "plan");
    write_nanogpt(d / "a.bin", 5000, 300, 1);
    write_nanogpt(d / "b.bin", 3001, 300, 2);
    auto stream = data::TokenStream::open("data.train", {d / "a.bin", d / "b.bin"},
                                          data::ShardFormat::NanoGpt);
    REQUIRE(stream->size() == 8001);
    data::Split split;
    split.pad_id = -1;
    split.blocks = std::make_shared<data::StreamBlocks>(stream, 0, stream->size(), 32, 300);
    REQUIRE(split.blocks->count() == 250);  // (8001 - 1) / 32
    const data::BatchPlan plan(split, 128, 11, /*shuffle=*/true);
    REQUIRE(plan.batches_per_epoch() == 63);  // 4 blocks per batch, the last one of 2
    std::set<int64_t> blocks;
    std::vector<std::set<int64_t>> rank(2);
    for (int64_t i = 0; i < plan.batches_per_epoch(); ++i)
      for (int64_t b : plan.batch(0, i)) {
        CHECK(blocks.insert(b).second);
        rank[size_t(i % 2)].insert(b);
      }
    CHECK(blocks.size() == 250);
    for (int64_t b : rank[0]) CHECK_FALSE(rank[1].count(b));
    CHECK(plan.batch(0, 0) != plan.batch(1, 0));  // a new order each epoch
    // A block's tokens are the stream's, the target the input shifted by one, across a shard end.
    const data::Batch batch = plan.make_batch({156});  // tokens 4992 … 5024
    std::vector<int32_t> want(33);
    stream->read(156 * 32, 33, want.data());
    for (int t = 0; t < 32; ++t) {
      CHECK(batch.tgt_in[size_t(t)] == want[size_t(t)]);
      CHECK(batch.tgt_out[size_t(t)] == want[size_t(t + 1)]);
    }
    CHECK(batch.target_tokens == 32);
    // The prefetcher gives the plan's batches, in order and after a jump; rank 1 of 2 (every
    // other batch of the update) its own only.
    BatchPrefetcher ahead(plan, 4), odd(plan, 2, /*world=*/2, /*rank=*/1);
    for (auto [e, i] : std::vector<std::pair<int64_t, int64_t>>{
             {0, 0}, {0, 1}, {0, 2}, {0, 62}, {1, 0}, {1, 1}, {0, 5}, {0, 6}}) {
      double waited = 0;
      const data::Batch got = ahead.take(e, i, 0, &waited);
      const data::Batch plain = plan.make_batch(plan.batch(e, i));
      CHECK(got.tgt_in == plain.tgt_in);
      CHECK(got.tgt_out == plain.tgt_out);
    }
    for (int64_t i = 1; i < 40; i += 2) {  // updates of 4 batches: rank 1 takes the 2nd and 4th
      double waited = 0;
      CHECK(odd.take(0, i, (i % 4), &waited).tgt_in == plan.make_batch(plan.batch(0, i)).tgt_in);
    }
  }

  // Issue 59.11: a weighted mixture of shard sets draws each block from a set with its weight's
  // share, from the block's index alone.
  TEST_CASE("a mixture of shard sets draws each set with its weight's share, the same every time") {
    const fs::path d = fresh_dir("normlab_shards", "mixture");
    // Set A holds only token 1, set B only token 2: a block's first token says where it came from.
    for (const auto& [name, token, n] : {std::tuple{"a.bin", 1, 70000}, {"b.bin", 2, 20000}}) {
      const std::vector<uint16_t> t(static_cast<size_t>(n), static_cast<uint16_t>(token));
      std::ofstream(d / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
    }
    write_nanogpt(d / "valid.bin", 4000, 200, 9);
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "nanogpt";
    cfg.vocab_size = 200;
    cfg.lm_block = 16;
    cfg.mixture = {(d / "a.bin").string(), (d / "b*.bin").string()};
    cfg.mixture_weights = {1, 3};
    cfg.valid = (d / "valid.bin").string();
    std::ostringstream log;
    const data::Dataset ds = data::load_dataset(cfg, log);
    const auto& blocks = *ds.train.blocks;
    REQUIRE(blocks.count() == (70000 - 1) / 16 + (20000 - 1) / 16);  // an epoch: both sets' blocks
    std::vector<int32_t> block(size_t(blocks.block_tokens()));
    int64_t from_b = 0;
    for (int64_t i = 0; i < blocks.count(); ++i) {
      blocks.read(i, block.data());
      from_b += block[0] == 2;
    }
    // 5,623 draws of weight 3/4 for B: 4,217 expected, standard deviation 32.5 (0.6 %).
    const double share = double(from_b) / double(blocks.count());
    MESSAGE("mixture 1:3: " << from_b << " of " << blocks.count() << " blocks from the second set");
    CHECK(std::abs(share - 0.75) < 0.03);
    std::vector<int32_t> again(block.size());
    for (int64_t i : {int64_t(0), int64_t(17), blocks.count() - 1}) {
      blocks.read(i, block.data());
      blocks.read(i, again.data());
      CHECK(block == again);
    }
    CHECK(ds.summary.find("mixture of") != std::string::npos);
    // A shard in two sets ("a*.bin" matches a.bin again) would be drawn with both weights; one
    // also held out would be validated on after training on it; a weight list of another length
    // (a DataConfig not read from a manifest) would be read past its end. Each one error.
    data::DataConfig twice = cfg;
    twice.mixture.push_back((d / "a*.bin").string());
    twice.mixture_weights.push_back(1);
    CHECK_THROWS_WITH_AS(
        data::load_dataset(twice, log),
        doctest::Contains(doctest::String(
            ("data.mixture[3]: '" + (d / "a.bin").string() + "' is also in data.mixture[1]")
                .c_str())),
        data::DataError);
    data::DataConfig held_out = cfg;
    held_out.valid = (d / "b.bin").string();
    CHECK_THROWS_WITH_AS(
        data::load_dataset(held_out, log),
        doctest::Contains(doctest::String(
            ("data.valid: '" + (d / "b.bin").string() + "' is also trained on (data.mixture[2])")
                .c_str())),
        data::DataError);
    held_out = cfg;
    held_out.mixture.clear();
    held_out.mixture_weights.clear();
    held_out.train = (d / "valid.bin").string();
    CHECK_THROWS_WITH_AS(data::load_dataset(held_out, log),
                         doctest::Contains("is also trained on (data.train"), data::DataError);
    data::DataConfig short_weights = cfg;
    short_weights.mixture_weights = {1};
    CHECK_THROWS_WITH_AS(data::load_dataset(short_weights, log),
                         doctest::Contains("data.mixture_weights: 1 weights for 2 mixture sets"),
                         data::DataError);
    // A mixture without data.valid: one error naming what it needs.
    cfg.valid.clear();
    CHECK_THROWS_WITH_AS(data::load_dataset(cfg, log),
                         doctest::Contains("data.mixture: needs data.valid"), data::DataError);
  }

  TEST_CASE("a run on shards killed mid-epoch resumes on the same batches, bitwise") {
    const fs::path d = fresh_dir("normlab_shards", "resume");
    write_nanogpt(d / "train.bin", 40000, 200, 3);
    write_nanogpt(d / "more.bin", 30000, 200, 4);
    write_nanogpt(d / "valid.bin", 4000, 200, 5);
    // One stream, or a weighted mixture of two sets (issue 59.11: exact on resume).
    std::string data_lines = fmt::format("train = \"{}\"", (d / "train.bin").string());
    SUBCASE("one stream") {}
    SUBCASE("a mixture of two sets") {
      data_lines = fmt::format(
          "mixture = [\"{}\", \"{}\"]\nmixture_weights = [2, 1]\nvalid = \"{}\"",
          (d / "train.bin").string(), (d / "more.bin").string(), (d / "valid.bin").string());
    }
    fs::remove_all(d / "whole");
    fs::remove_all(d / "split");
    const fs::path m = d / "m.toml";
    // A mixture's manifest errors name the key and what was expected.
    for (const auto& [lines, want] :
         {std::pair{"mixture = [\"a.bin\", \"b.bin\"]\nmixture_weights = [1]\nvalid = \"v.bin\"",
                    "[data] mixture_weights: 1 weights for 2 mixture sets: one per set"},
          {"mixture = [\"a.bin\"]\nmixture_weights = [0]\nvalid = \"v.bin\"",
           "[data] mixture_weights: weight 1 is 0: expected a whole number from 1 to 1000000000"},
          // Larger weights could make their sum wrap around 2^64 (the draw is modulo the sum).
          {"mixture = [\"a.bin\", \"b.bin\"]\nmixture_weights = [1, 9223372036854775807]\nvalid = "
           "\"v.bin\"",
           "[data] mixture_weights: weight 2 is 9223372036854775807: expected a whole number"},
          {"mixture = [\"a.bin\"]\nmixture_weights = [1]",
           "[data] mixture: a mixture needs data.valid"},
          {"train = \"a.bin\"\nmixture = [\"a.bin\"]\nmixture_weights = [1]\nvalid = \"v.bin\"",
           "[data] mixture: give data.train or data.mixture, not both"},
          // Each listed file is resolved and must exist (a glob may match later).
          {"mixture = [\"a.bin\", \"gone.bin\"]\nmixture_weights = [1, 1]\nvalid = \"v.bin\"",
           "[data] mixture: file not found: "},
          {"mixture = [\"a.bin\"]\nmixture_weights = [1]\nvalid = \"v.bin\"\n[eval]\ntasks = "
           "[\"gone.jsonl\"]",
           "[eval] tasks: file not found: "}}) {
      std::ofstream(d / "bad.toml") << "[model]\narch = \"lm\"\n[data]\ntask = \"lm\"\nformat = "
                                       "\"nanogpt\"\nvocab_size = 200\n"
                                    << lines << "\n";
      for (const char* f : {"a.bin", "b.bin", "v.bin"}) write_nanogpt(d / f, 100, 200, 1);
      CHECK_THROWS_WITH(load_manifest((d / "bad.toml").string(), {}, &builtin_registry()),
                        doctest::Contains(want));
    }
    std::ofstream(m) << fmt::format(R"([model]
arch = "lm"
family = "llama"
d_model = 16
ffn_dim = 32
heads = 2
dec_layers = 1
dropout = 0.1
[scheme]
name = "pre-ln"
[data]
task = "lm"
format = "nanogpt"
{}
vocab_size = 200
lm_block = 32
[optim]
max_tokens = 128
max_updates = 8
[eval]
interval = 0
valid_tokens = 2048
[run]
log_interval = 2
checkpoint_interval = 100
threads = 1
)",
                                    data_lines);
    std::ostringstream sink;
    auto spec_for = [&](const std::string& out) {
      return load_manifest(m.string(), {"run.out_dir=\"" + (d / out).string() + "\""},
                           &builtin_registry());
    };
    const ExperimentSpec whole = spec_for("whole");
    REQUIRE(train(whole, builtin_registry(), sink).status == "completed");
    CHECK(sink.str().find("nanogpt shards, mapped)") != std::string::npos);
    const ExperimentSpec split = spec_for("split");
    InterruptAt stop(5);
    TrainControl control;
    control.observers = {&stop};
    REQUIRE(train(split, builtin_registry(), sink, control).status == "interrupted");
    REQUIRE(train(split, builtin_registry(), sink).status == "completed");
    util::SafetensorsReader a(d / "whole" / "checkpoints" / "last.safetensors"),
        b(d / "split" / "checkpoints" / "last.safetensors");
    int compared = 0;
    for (const auto& [name, e] : a.entries())
      if (name.rfind("model/", 0) == 0 || name.rfind("optimizer/", 0) == 0) {
        CAPTURE(name);
        CHECK(torch::equal(a.read(name), b.read(name)));
        ++compared;
      }
    CHECK(compared > 10);
    // Token 0 is a token here (no padding): the embedding's row 0 trains like any other.
    CHECK(a.read("model/decoder.embed_tokens.weight")[0].abs().sum().item<double>() > 0);
  }
}

}  // namespace normlab_test_lm_shards
