// LM data at research scale (issue 44): token shards through mmap, a seeded block order computed
// per batch, batches made ahead on a thread, a resume on the same batches, disjoint rank shares.
// The formats written by numpy as their tools write them: tests/check_token_shards.py.
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "data/internal.h"
#include "data/token_shards.h"
#include "interrupt_at.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "test_support.h"
#include "train/batch_prefetch.h"
#include "util/atomic_file.h"
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

// What a call throws as a DataError ("" when nothing).
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const data::DataError& e) {
    return e.what();
  }
  return "";
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
    const data::BatchPlan plan(ds.train, 16 * 64, 1, /*shuffle=*/true);
    int64_t from_b = 0, drawn = 0;
    for (int64_t i = 0; i < plan.batches_per_epoch(); ++i) {
      const data::Batch b = plan.make_batch(plan.batch(0, i));
      for (int64_t r = 0; r < b.size; ++r, ++drawn) from_b += b.tgt_in[size_t(r * 16)] == 2;
    }
    REQUIRE(drawn == blocks.count());
    // 5,623 draws of weight 3/4 for B: 4,217 expected, standard deviation 32.5 (0.6 %).
    const double share = double(from_b) / double(drawn);
    MESSAGE("mixture 1:3: " << from_b << " of " << drawn << " blocks from the second set");
    CHECK(std::abs(share - 0.75) < 0.03);
    for (int64_t i : {int64_t(0), int64_t(17), plan.batches_per_epoch() - 1})
      CHECK(plan.make_batch(plan.batch(0, i)).tgt_in == plan.make_batch(plan.batch(0, i)).tgt_in);
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

  // Issue 66.1: each place of an epoch drew from a hash of the place alone, so every epoch and
  // seed trained on one multiset of blocks (~1/e of each set never). Now the draws are fresh per
  // (run.seed, epoch) and still a function of them: equal after a resume and on every rank.
  TEST_CASE("a mixture draws anew each epoch and seed: every block in time, the same on resume") {
    const fs::path d = fresh_dir("normlab_shards", "mixture_epochs");
    // Token t of set A is t / 16, of set B 5000 + t / 16: a block's first token names it.
    constexpr int64_t kBlock = 16, kA = (70000 - 1) / kBlock, kB = (20000 - 1) / kBlock;
    for (const auto& [name, base, n] : {std::tuple{"a.bin", 0, 70000}, {"b.bin", 5000, 20000}}) {
      std::vector<uint16_t> t(static_cast<size_t>(n));
      for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>(base + int(i) / kBlock);
      std::ofstream(d / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(t.data()), std::streamsize(t.size() * 2));
    }
    write_nanogpt(d / "valid.bin", 4000, 200, 9);
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "nanogpt";
    cfg.vocab_size = 8000;
    cfg.lm_block = kBlock;
    cfg.mixture = {(d / "a.bin").string(), (d / "b.bin").string()};
    cfg.mixture_weights = {1, 3};
    cfg.valid = (d / "valid.bin").string();
    std::ostringstream log;
    const data::Dataset ds = data::load_dataset(cfg, log);
    REQUIRE(ds.train.blocks->count() == kA + kB);
    // The first token of each block an epoch trains on, in order.
    auto epoch_blocks = [&](const data::Dataset& data, uint64_t seed, int64_t epoch) {
      const data::BatchPlan plan(data.train, kBlock * 64, seed, /*shuffle=*/true);
      std::vector<int32_t> first;
      for (int64_t i = 0; i < plan.batches_per_epoch(); ++i) {
        const data::Batch b = plan.make_batch(plan.batch(epoch, i));
        for (int64_t r = 0; r < b.size; ++r) first.push_back(int32_t(b.tgt_in[size_t(r * kBlock)]));
      }
      return first;
    };
    std::vector<int64_t> count_a(kA), count_b(kB);
    int64_t draws_a = 0, draws_b = 0;
    std::map<std::pair<uint64_t, int64_t>, std::vector<int32_t>> sorted;  // (seed, epoch)
    for (uint64_t seed : {1, 2}) {
      for (int64_t epoch = 0; epoch < 8; ++epoch) {
        std::vector<int32_t> first = epoch_blocks(ds, seed, epoch);
        REQUIRE(int64_t(first.size()) == kA + kB);  // an epoch: as many draws as blocks
        for (int32_t t : first) {
          REQUIRE(((t >= 0 && t < kA) || (t >= 5000 && t < 5000 + kB)));
          t < 5000 ? (++count_a[size_t(t)], ++draws_a) : (++count_b[size_t(t - 5000)], ++draws_b);
        }
        std::sort(first.begin(), first.end());
        sorted[{seed, epoch}] = first;
        // Coverage so far against sampling with replacement: 1 - (1 - 1/n)^draws of each set,
        // within 5 binomial standard deviations (the covered count varies less than that).
        for (const auto& [counts, draws] : {std::pair{&count_a, draws_a}, {&count_b, draws_b}}) {
          const double n = double(counts->size());
          const double p = 1 - std::pow(1 - 1 / n, double(draws));
          const double covered = double(
              std::count_if(counts->begin(), counts->end(), [](int64_t c) { return c > 0; }));
          CAPTURE(seed);
          CAPTURE(epoch);
          CHECK(std::abs(covered / n - p) < 5 * std::sqrt(p * (1 - p) / n) + 1e-9);
        }
      }
      if (seed == 1)  // 8 epochs of ~3.4 draws per block of B: P(one missed) = 1249 · e^-27
        CHECK(std::count(count_b.begin(), count_b.end(), 0) == 0);
    }
    const auto never_a = std::count(count_a.begin(), count_a.end(), 0);
    MESSAGE("16 epochs of mixture 1:3: "
            << never_a << " of " << kA << " blocks of set A never drawn"
            << ", " << draws_b << " of " << draws_a + draws_b << " draws from set B");
    CHECK(never_a < kA / 50);  // e^-5.1 = 0.6 % expected; one multiset every epoch left 72 %
    // Other epochs and seeds, other multisets.
    CHECK(sorted[{1, 0}] != sorted[{1, 1}]);
    CHECK(sorted[{1, 0}] != sorted[{2, 0}]);
    // The weights' shares over 89,968 draws: 3/4 from B, standard deviation 0.14 %.
    CHECK(std::abs(double(draws_b) / double(draws_a + draws_b) - 0.75) < 0.006);
    // Uniform within a set: Pearson's chi-square of the counts is n - 1 ± sqrt(2 (n - 1)).
    for (const auto* counts : {&count_a, &count_b}) {
      const double n = double(counts->size());
      const double total = double(std::accumulate(counts->begin(), counts->end(), int64_t(0)));
      double chi2 = 0;
      for (int64_t c : *counts) chi2 += std::pow(double(c) - total / n, 2) / (total / n);
      CAPTURE(chi2);
      CHECK(std::abs(chi2 - (n - 1)) < 5 * std::sqrt(2 * (n - 1)));
    }
    // A resumed run loads the data again and makes a new plan: the same draws, from any batch on,
    // and the prefetcher of each of two ranks gives the plan's batches for its own positions.
    const data::Dataset again = data::load_dataset(cfg, log);
    CHECK(epoch_blocks(again, 2, 5) == epoch_blocks(ds, 2, 5));
    const data::BatchPlan plan(ds.train, kBlock * 64, 7, true),
        resumed(again.train, kBlock * 64, 7, true);
    BatchPrefetcher rank0(resumed, 2, /*world=*/2, /*rank=*/0),
        rank1(resumed, 2, /*world=*/2, /*rank=*/1);
    for (int64_t i = 37; i < 60; ++i) {  // from mid-epoch 3 on, one update = 2 batches
      double waited = 0;
      const data::Batch want = plan.make_batch(plan.batch(3, i));
      CHECK(resumed.batch(3, i) == plan.batch(3, i));
      CHECK((i % 2 == 0 ? rank0 : rank1).take(3, i, i % 2, &waited).tgt_in == want.tgt_in);
    }
  }

  // Issue 66.8: held-out and mixture files were compared by path: a hard link or a copy of a
  // training shard was validated on, or drawn from two sets. Now the same file (st_dev, st_ino) or
  // the same bytes (the SHA-256 shards.json records, else computed for files of one size whose
  // sampled fingerprints agree) are refused, naming both.
  TEST_CASE("a link or a copy of a training shard is the same data: refused naming both") {
    const fs::path d = fresh_dir("normlab_shards", "same_data");
    write_nanogpt(d / "a.bin", 3000, 200, 1);
    // 1 MiB: the sampled fingerprint (17 pieces of 4 KiB) leaves most bytes unread.
    write_nanogpt(d / "b.bin", 524288, 200, 2);
    write_nanogpt(d / "valid.bin", 4000, 200, 3);
    fs::create_hard_link(d / "b.bin", d / "linked.bin");
    fs::create_symlink(d / "b.bin", d / "symlinked.bin");
    fs::copy_file(d / "b.bin", d / "copy.bin");
    fs::copy_file(d / "b.bin", d / "near.bin");  // one token other, between two sampled pieces
    {
      std::fstream f(d / "near.bin", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(10000);
      f.write("\x07\x00", 2);
    }
    const std::string b_sha = util::sha256_file(d / "b.bin");
    REQUIRE(util::sha256_file(d / "near.bin") != b_sha);
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "nanogpt";
    cfg.vocab_size = 200;
    cfg.lm_block = 16;
    cfg.mixture = {(d / "a.bin").string(), (d / "b.bin").string()};
    cfg.mixture_weights = {1, 1};
    cfg.valid = (d / "valid.bin").string();
    std::ostringstream log;
    CHECK_NOTHROW(data::load_dataset(cfg, log));
    const std::string b = (d / "b.bin").string();
    for (const auto& [name, how] : {std::pair{"linked.bin", std::string("the same file (a link)")},
                                    {"symlinked.bin", std::string("the same file (a link)")},
                                    {"copy.bin", "a copy: SHA-256 " + b_sha.substr(0, 12) + "…"}}) {
      CAPTURE(name);
      const std::string file = (d / name).string();
      data::DataConfig held_out = cfg;
      held_out.valid = file;
      CHECK_THROWS_WITH_AS(
          data::load_dataset(held_out, log),
          doctest::Contains(doctest::String(fmt::format("data.valid: '{}' is also trained on "
                                                        "(data.mixture[2], as '{}': {})",
                                                        file, b, how)
                                                .c_str())),
          data::DataError);
      held_out = cfg;
      held_out.test = file;
      CHECK_THROWS_WITH_AS(data::load_dataset(held_out, log),
                           doctest::Contains(doctest::String(
                               fmt::format("data.test: '{}' is also trained on", file).c_str())),
                           data::DataError);
      data::DataConfig two_sets = cfg;
      two_sets.mixture.push_back(file);
      two_sets.mixture_weights.push_back(1);
      CHECK_THROWS_WITH_AS(
          data::load_dataset(two_sets, log),
          doctest::Contains(doctest::String(
              fmt::format("data.mixture[3]: '{}' is also in data.mixture[2], as '{}': {}", file, b,
                          how)
                  .c_str())),
          data::DataError);
      data::DataConfig one_stream = cfg;
      one_stream.mixture.clear();
      one_stream.mixture_weights.clear();
      one_stream.train = b;
      one_stream.valid = file;
      CHECK_THROWS_WITH_AS(
          data::load_dataset(one_stream, log),
          doctest::Contains(doctest::String(
              fmt::format("is also trained on (data.train '{}', as '{}': {})", b, b, how).c_str())),
          data::DataError);
    }
    // Same size, same sampled pieces, one token other: other data (the whole SHA-256 differs).
    data::DataConfig near = cfg;
    near.valid = (d / "near.bin").string();
    CHECK_NOTHROW(data::load_dataset(near, log));
    // Validation and test may share data.
    fs::create_hard_link(d / "valid.bin", d / "valid_link.bin");
    data::DataConfig shared = cfg;
    shared.test = (d / "valid_link.bin").string();
    CHECK_NOTHROW(data::load_dataset(shared, log));

    // normlab shards: the SHA-256s of shards.json are compared, no file is hashed again. A shard
    // whose shards.json records another's hash is taken at its word here (its background check
    // fails the run).
    for (const char* folder : {"n1", "n2", "n3"}) fs::create_directories(d / folder);
    fs::copy_file(d / "a.bin", d / "n1" / "shard_000.bin");
    fs::copy_file(d / "a.bin", d / "n2" / "shard_000.bin");
    write_nanogpt(d / "n3" / "shard_000.bin", 3000, 200, 4);
    const std::string a_sha = util::sha256_file(d / "a.bin");
    for (const char* folder : {"n1", "n2", "n3"}) {
      data::ShardSet set;
      set.vocab_size = 200;
      set.eos_id = 0;
      set.shards.push_back({"shard_000.bin", 3000, a_sha, 199});
      std::ofstream(d / folder / "shards.json") << data::shard_set_json(set);
    }
    data::DataConfig normlab = cfg;
    normlab.format = "normlab";
    normlab.vocab_size = 0;
    normlab.cache_dir = (d / "cache").string();
    normlab.mixture = {(d / "n1" / "shard_*.bin").string()};
    normlab.mixture_weights = {1};
    for (const char* folder : {"n2", "n3"}) {
      CAPTURE(folder);
      normlab.valid = (d / folder / "shard_000.bin").string();
      CHECK_THROWS_WITH_AS(
          data::load_dataset(normlab, log),
          doctest::Contains(doctest::String(
              fmt::format("is also trained on (data.mixture[1], as '{}': a copy: SHA-256 {}",
                          (d / "n1" / "shard_000.bin").string(), a_sha.substr(0, 12))
                  .c_str())),
          data::DataError);
    }
  }

  // Issue 66.14: shards.json's "tokenizer" was any path: a FIFO hung every command that loads the
  // data, /dev/zero was read until memory ran out, a folder failed without a name. Now, as a
  // shard: a regular file in the folder.
  TEST_CASE("the tokenizer shards.json names is a regular file beside it, else one error") {
    const fs::path d = fresh_dir("normlab_shards", "tokenizer_file");
    write_nanogpt(d / "shard_000.bin", 4000, 100, 1);
    fs::create_directory(d / "folder.model");
    REQUIRE(::mkfifo((d / "fifo.model").c_str(), 0600) == 0);
    fs::create_symlink("/dev/zero", d / "zero.model");
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "normlab";
    cfg.lm_block = 16;
    cfg.train = (d / "shard_000.bin").string();
    cfg.cache_dir = (d / "cache").string();
    const std::string json_file = (d / "shards.json").string();
    for (const auto& [tokenizer, want] : std::vector<std::pair<json, std::string>>{
             {"/dev/zero",
              "tokenizer: expected the file name of a SentencePiece model in the "
              "same folder"},
             {"../shard_000.bin", "tokenizer: expected the file name"},
             {"..", "tokenizer: expected the file name"},
             {42, "tokenizer: expected the file name"},
             {"folder.model", "is a folder"},
             {"fifo.model", "is a FIFO"},
             {"zero.model", "is a device"},
             {"missing.model", "cannot be opened: No such file or directory"}}) {
      CAPTURE(tokenizer.dump());
      data::ShardSet set;
      set.vocab_size = 100;
      set.eos_id = 3;
      set.shards.push_back({"shard_000.bin", 4000, util::sha256_file(d / "shard_000.bin"), 99});
      json j = json::parse(data::shard_set_json(set));
      j["tokenizer"] = tokenizer;
      std::ofstream(json_file) << j.dump();
      std::ostringstream log;
      // Bounded: before the fix the FIFO blocked until a writer came (released here as one).
      auto loading = std::async(std::launch::async, [&] {
        try {
          data::load_dataset(cfg, log);
        } catch (const data::DataError& e) {
          return std::string(e.what());
        }
        return std::string("loaded");
      });
      if (loading.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
        const int fd = ::open((d / "fifo.model").c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
        FAIL_CHECK("loading the data hung");
      }
      const std::string error = loading.get();
      CHECK(error.find(json_file) != std::string::npos);
      CHECK(error.find(want) != std::string::npos);
    }
    // shards.json itself a FIFO: one error too (an ifstream waited for a writer).
    fs::remove(json_file);
    REQUIRE(::mkfifo(json_file.c_str(), 0600) == 0);
    std::ostringstream log;
    auto loading = std::async(std::launch::async,
                              [&] { return error_text([&] { data::load_dataset(cfg, log); }); });
    if (loading.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
      const int fd = ::open(json_file.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
      FAIL_CHECK("loading the data hung");
    }
    CHECK(loading.get().find(json_file + ": is a FIFO (a named pipe)") != std::string::npos);
  }

  // Issue 66.21: folders of two tokenizers alike in size and EOS were refused quoting equal
  // vocab_size and eos_id; now the message names both tokenizer files and their SHA-256s.
  TEST_CASE("shards of two tokenizers of one size are refused naming both files and hashes") {
    const fs::path d = fresh_dir("normlab_shards", "two_tokenizers");
    std::mt19937 rng(5);
    auto model = [&](const std::string& letters) {
      std::vector<std::string> lines(400);
      for (auto& l : lines)
        for (int w = 0; w < 8; ++w) {
          for (int c = 0; c < 5; ++c) l += letters[rng() % letters.size()];
          l += ' ';
        }
      std::vector<const std::string*> text;
      for (const auto& l : lines) text.push_back(&l);
      return data::detail::train_sentencepiece(
          {{"model_type", "bpe"}, {"vocab_size", "60"}, {"minloglevel", "1"}}, text);
    };
    const std::string first = model("abcdefghijklm"), second = model("nopqrstuvwxyz");
    REQUIRE(first != second);
    const data::detail::SentencePieceTokenizer tok(first, "first", false);
    for (const auto& [folder, bytes, seed] : {std::tuple{"t1", &first, 1u},
                                              {"t2", &second, 2u},
                                              {"t3", &first, 3u},
                                              {"t4", &first, 4u}}) {
      fs::create_directories(d / folder);
      write_nanogpt(d / folder / "shard_000.bin", 4000, 50, seed);
      data::ShardSet set;
      set.vocab_size = tok.vocab_size();
      set.eos_id = tok.eos_id();
      set.tokenizer = std::string(folder) == "t4" ? "" : "tokenizer.model";
      set.shards.push_back(
          {"shard_000.bin", 4000, util::sha256_file(d / folder / "shard_000.bin"), 49});
      std::ofstream(d / folder / "shards.json") << data::shard_set_json(set);
      if (!set.tokenizer.empty())
        std::ofstream(d / folder / "tokenizer.model", std::ios::binary) << *bytes;
    }
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "normlab";
    cfg.lm_block = 16;
    cfg.cache_dir = (d / "cache").string();
    cfg.train = (d / "t1" / "shard_000.bin").string();
    cfg.valid = (d / "t3" / "shard_000.bin").string();  // another copy of the same tokenizer
    std::ostringstream log;
    CHECK_NOTHROW(data::load_dataset(cfg, log));
    auto named = [&](const char* folder) {
      return fmt::format("{} names the tokenizer {} (SHA-256 {})",
                         (d / folder / "shards.json").string(),
                         (d / folder / "tokenizer.model").string(),
                         util::sha256_file(d / folder / "tokenizer.model"));
    };
    cfg.valid = (d / "t2" / "shard_000.bin").string();  // validation is read first
    const std::string error = error_text([&] { data::load_dataset(cfg, log); });
    CHECK(error.find(named("t1")) != std::string::npos);
    CHECK(error.find(named("t2")) != std::string::npos);
    CHECK(error.find("vocab_size 60 and eos_id") != std::string::npos);
    cfg.valid = (d / "t4" / "shard_000.bin").string();
    CHECK(error_text([&] {
            data::load_dataset(cfg, log);
          }).find((d / "t4" / "shards.json").string() + " names no tokenizer") !=
          std::string::npos);
  }

  // Issue 66.18: the .npy header was searched for its keys, so a header numpy refuses (another
  // key, a key twice, no closing brace, a fortran_order that is not a bool) was read, and an int32
  // array with a planted key trained as uint16. Now it is read as numpy reads it.
  TEST_CASE(
      "a .npy header is read as numpy reads it: numpy's files taken, what it refuses refused") {
    const fs::path d = fresh_dir("normlab_shards", "npy");
    constexpr int64_t kN = 3000;
    std::vector<int32_t> tokens(static_cast<size_t>(kN));
    std::mt19937 rng(3);
    for (auto& t : tokens) t = int32_t(rng() % 1000);
    auto body = [&](int bytes) {
      std::string out;
      for (int32_t t : tokens) out.append(reinterpret_cast<const char*>(&t), size_t(bytes));
      return out;
    };
    // As numpy.lib.format writes: magic, version, header length, the header padded with spaces
    // and ended by '\n' so that the data start at a multiple of 64.
    auto write = [&](const std::string& name, const std::string& header, int bytes, int major = 1,
                     int minor = 0, bool pad = true) {
      const size_t prefix = major == 1 ? 10 : 12;
      std::string h = header;
      if (pad) {
        h.append((64 - (prefix + h.size() + 1) % 64) % 64, ' ');
        h += '\n';
      }
      std::string file = std::string("\x93NUMPY", 6) + char(major) + char(minor);
      const uint32_t len = uint32_t(h.size());
      file.append(reinterpret_cast<const char*>(&len), major == 1 ? 2 : 4);
      std::ofstream(d / name, std::ios::binary) << file << h << body(bytes);
      return d / name;
    };
    auto read_all = [&](const fs::path& p) {
      auto stream = data::TokenStream::open("data.train", {p}, data::ShardFormat::Npy);
      std::vector<int32_t> out(size_t(stream->size()));
      stream->read(0, stream->size(), out.data());
      return out;
    };
    const std::string n = std::to_string(kN);
    // Taken: numpy 1.24's own header for each dtype and version, and other spellings of it.
    const std::vector<std::tuple<std::string, std::string, int, int>> taken = {
        {"u2.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (" + n + ",), }", 2, 1},
        {"u4_v2.npy", "{'descr': '<u4', 'fortran_order': False, 'shape': (" + n + ",), }", 4, 2},
        {"i4_v3.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (" + n + ",), }", 4, 3},
        {"spelled.npy",
         "{\"shape\": ((" + n + "L,)),  # a comment\n 'fortran_order':False,'descr':\"<u2\"}", 2,
         1},
    };
    for (const auto& [name, header, bytes, major] : taken) {
      CAPTURE(name);
      CHECK(read_all(write(name, header, bytes, major)) == tokens);
    }
    // Refused, each naming what numpy would not take.
    const std::string tail = "'fortran_order': False, 'shape': (" + n + ",)";
    const std::string twice = std::to_string(2 * kN);
    const std::vector<std::tuple<std::string, std::string, int, std::string>> refused = {
        // The int32 array with a planted dict: read as uint16, 2N tokens, every other one 0.
        {"planted.npy",
         "{'x': {'descr': '<u2', 'shape': (" + twice + ",)}, 'descr': '<i4', " + tail + "}", 4,
         "key 'x': numpy's header holds only 'descr', 'fortran_order' and 'shape'"},
        {"extra.npy", "{'descr': '<i4', " + tail + ", 'extra': 0}", 4, "key 'extra'"},
        {"twice.npy",
         "{'descr': '<u2', 'fortran_order': False, 'shape': (" + twice +
             ",), 'descr': '<i4', "
             "'shape': (" +
             n + ",)}",
         4, "'descr' twice"},
        {"open.npy", "{'descr': '<u2', " + tail + ", ", 2,
         "a key: expected a quoted string, found the header's end (no closing '}')"},
        {"order_int.npy", "{'descr': '<u2', 'fortran_order': 0, 'shape': (" + n + ",)}", 2,
         "'fortran_order': 0: expected True or False"},
        {"order_str.npy", "{'descr': '<u2', 'fortran_order': 'False', 'shape': (" + n + ",)}", 2,
         "'fortran_order': 'False': expected True or False"},
        {"order_none.npy", "{'descr': '<u2', 'fortran_order': None, 'shape': (" + n + ",)}", 2,
         "'fortran_order': None: expected True or False"},
        {"no_order.npy", "{'descr': '<u2', 'shape': (" + n + ",)}", 2, "no 'fortran_order'"},
        {"after.npy", "{'descr': '<u2', " + tail + "} 'x'", 2, "after the dict's closing '}'"},
        {"list.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': [" + n + "]}", 2,
         "'shape': a list, '[" + n + "]"},
        {"float.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (" + n + ".0,)}", 2,
         "'shape': " + n + ".0: not a whole number"},
        {"zeros.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (0" + n + ",)}", 2,
         "'shape': 0" + n + ": not a whole number"},
        {"bytes.npy", "{'descr': b'<u2', " + tail + "}", 2, "'descr': b"},
        {"joined.npy", "{'descr': '<' 'u2', " + tail + "}", 2, "'descr': two strings in a row"},
        {"deep.npy",
         "{'descr': '<u2', 'fortran_order': False, 'shape': " + std::string(5000, '(') + "}", 2,
         "'shape': nested too deep"},
        {"signs.npy",
         "{'descr': '<u2', 'fortran_order': False, 'shape': (" + std::string(5000, '-') + "1,)}", 2,
         "'shape': nested too deep"},
        {"not_dict.npy", "('descr', '<u2')", 2, "the header is not a dict"},
        // numpy reads these as 2-D arrays: one dimension is what docs/data.md asks for.
        {"row.npy", "{'descr': '<u2', 'fortran_order': True, 'shape': (1, " + n + "), }", 2,
         "shape (1, " + n + "): expected one dimension of tokens"},
        {"column.npy", "{'descr': '<u2', 'fortran_order': False, 'shape': (" + n + ", 1), }", 2,
         "shape (" + n + ", 1): expected one dimension of tokens"},
    };
    for (const auto& [name, header, bytes, want] : refused) {
      CAPTURE(name);
      const fs::path p = write(name, header, bytes);
      CHECK_THROWS_WITH_AS(read_all(p),
                           doctest::Contains(doctest::String(
                               (p.string() + ": not a NumPy token array (" + want).c_str())),
                           data::DataError);
    }
    const fs::path v11 = write("v11.npy", "{'descr': '<u2', " + tail + "}", 2, 1, 1);
    CHECK_THROWS_WITH_AS(read_all(v11), doctest::Contains("format version 1.1: numpy reads"),
                         data::DataError);
    // numpy itself, where Debian's python3-numpy is installed: it writes files read here to the
    // same tokens, and it refuses every header refused above but two it never writes, refused
    // here rather than read as literal_eval reads them: a key twice (the last one counts) and two
    // strings in a row (joined).
    if (std::system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
      MESSAGE("SKIP numpy cross-check: /usr/bin/python3 has no numpy");
      return;
    }
    std::ofstream(d / "tokens.txt") << [&] {
      std::string s;
      for (int32_t t : tokens) s += std::to_string(t) + "\n";
      return s;
    }();
    std::ofstream(d / "numpy_check.py") << R"(import sys, os, numpy as np
from numpy.lib import format as F
d = sys.argv[1]
t = np.loadtxt(os.path.join(d, "tokens.txt"), dtype=np.int64)
np.save(os.path.join(d, "np_u2.npy"), t.astype(np.uint16))
np.save(os.path.join(d, "np_u4.npy"), t.astype(np.uint32))
np.save(os.path.join(d, "np_i4_row.npy"), t.astype(np.int32).reshape(1, -1))
np.save(os.path.join(d, "np_u2_col_fortran.npy"), np.asfortranarray(t.astype(np.uint16).reshape(-1, 1)))
for v in [(2, 0), (3, 0)]:
    with open(os.path.join(d, "np_u2_v%d.npy" % v[0]), "wb") as f:
        F.write_array(f, t.astype(np.uint16), version=v)
for name in sorted(os.listdir(d)):
    if name.endswith(".npy") and not name.startswith("np_"):
        try:
            np.load(os.path.join(d, name))
            print("loaded", name)
        except Exception:
            print("refused", name)
)";
    const std::string cmd = "/usr/bin/python3 " + (d / "numpy_check.py").string() + " " +
                            d.string() + " > " + (d / "numpy_said.txt").string();
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::set<std::string> numpy_loaded, numpy_refused;
    std::ifstream said(d / "numpy_said.txt");
    for (std::string verdict, name; said >> verdict >> name;)
      (verdict == "loaded" ? numpy_loaded : numpy_refused).insert(name);
    for (const auto& [name, header, bytes, major] : taken) CHECK(numpy_loaded.count(name) == 1);
    for (const auto& [name, header, bytes, want] : refused)
      CHECK(numpy_refused.count(name) == (name == "twice.npy" || name == "joined.npy" ||
                                                  name == "row.npy" || name == "column.npy"
                                              ? 0u
                                              : 1u));
    CHECK(numpy_refused.count("v11.npy") == 1);
    for (const char* name : {"np_u2.npy", "np_u4.npy", "np_u2_v2.npy", "np_u2_v3.npy"}) {
      CAPTURE(name);
      CHECK(read_all(d / name) == tokens);
    }
    for (const char* name : {"np_i4_row.npy", "np_u2_col_fortran.npy"}) {  // 2-D in numpy
      CAPTURE(name);
      CHECK_THROWS_WITH_AS(read_all(d / name),
                           doctest::Contains("expected one dimension of tokens"), data::DataError);
    }
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

  // The shard-check cache matched path, size and mtime: a shard rewritten with a training shard's
  // bytes and its mtime put back (cp -p, rsync -a, touch -r) skipped its SHA-256 check, so the
  // run validated on training data. The inode's change time (not settable) is in the key now.
  TEST_CASE("a shard replaced with its mtime restored is hashed again and refused") {
    const fs::path d = fresh_dir("normlab_shards", "stale_check");
    for (const char* folder : {"ma", "nx"}) {
      fs::create_directories(d / folder);
      write_nanogpt(d / folder / "shard_000.bin", 3000, 200, folder[0] == 'm' ? 1 : 2);
      data::ShardSet set;
      set.vocab_size = 200;
      set.eos_id = 0;
      set.shards.push_back(
          {"shard_000.bin", 3000, util::sha256_file(d / folder / "shard_000.bin"), 199});
      std::ofstream(d / folder / "shards.json") << data::shard_set_json(set);
    }
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "normlab";
    cfg.lm_block = 16;
    cfg.cache_dir = (d / "cache").string();
    cfg.mixture = {(d / "ma" / "shard_*.bin").string()};
    cfg.mixture_weights = {1};
    cfg.valid = (d / "nx" / "shard_*.bin").string();
    std::ostringstream log;
    {
      data::Dataset ds = data::load_dataset(cfg, log);
      REQUIRE(ds.integrity);
      REQUIRE(ds.integrity->wait() == "");  // passed: stamped in the cache
    }
    const fs::path nx = d / "nx" / "shard_000.bin";
    const auto mtime = fs::last_write_time(nx);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));  // a coarse clock's tick
    {
      std::ifstream in(d / "ma" / "shard_000.bin", std::ios::binary);
      std::ofstream out(nx, std::ios::binary | std::ios::trunc);
      out << in.rdbuf();
    }
    fs::last_write_time(nx, mtime);
    REQUIRE(fs::file_size(nx) == fs::file_size(d / "ma" / "shard_000.bin"));
    data::Dataset ds = data::load_dataset(cfg, log);
    REQUIRE(ds.integrity);
    const std::string problem = ds.integrity->wait();
    CHECK(problem.find(nx.string() + ": SHA-256") != std::string::npos);
    CHECK(problem.find("is not the") != std::string::npos);
  }

  // Resume compares what orders the blocks (run.seed, data.lm_block, data.sampling, a mixture's
  // draws): a position in another order means nothing. Eval, export, forward and ablate read the
  // same data in any order: a checkpoint from before per-epoch draws is scored, not refused.
  TEST_CASE("resume refuses another block order; reading a checkpoint ignores the order") {
    const fs::path d = fresh_dir("normlab_shards", "order_identity");
    write_nanogpt(d / "a.bin", 3000, 200, 1);
    write_nanogpt(d / "b.bin", 3000, 200, 2);
    write_nanogpt(d / "valid.bin", 1000, 200, 3);
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "nanogpt";
    cfg.vocab_size = 200;
    cfg.lm_block = 16;
    cfg.seed = 1;
    cfg.mixture = {(d / "a.bin").string(), (d / "b.bin").string()};
    cfg.mixture_weights = {1, 2};
    cfg.valid = (d / "valid.bin").string();
    std::ostringstream log;
    const std::string run = data::load_dataset(cfg, log).identity;
    const auto resume = [&](const std::string& now) {
      return data::data_identity_change(run, now, data::DataUse::Resume);
    };
    const auto read = [&](const std::string& now) {
      return data::data_identity_change(run, now, data::DataUse::Read);
    };
    CHECK(resume(run) == "");
    data::DataConfig other = cfg;
    other.seed = 7;
    CHECK(resume(data::load_dataset(other, log).identity).find("run.seed was 1, now 7") !=
          std::string::npos);
    CHECK(read(data::load_dataset(other, log).identity) == "");
    other = cfg;
    other.lm_block = 32;
    CHECK(resume(data::load_dataset(other, log).identity).find("data.lm_block was 16, now 32") !=
          std::string::npos);
    other = cfg;
    other.mixture.clear();
    other.mixture_weights.clear();
    other.train = (d / "a.bin").string();
    data::DataConfig sequential = other;
    sequential.sampling = "sequential";
    CHECK(data::data_identity_change(data::load_dataset(other, log).identity,
                                     data::load_dataset(sequential, log).identity)
              .find("data.sampling was \"random\", now \"sequential\"") != std::string::npos);
    // A mixture checkpoint without mixture_draws (an older normlab), or with a value unknown here.
    json old = json::parse(run);
    old.erase("mixture_draws");
    CHECK(data::data_identity_change(old.dump(), run, data::DataUse::Read) == "");
    const std::string older = data::data_identity_change(old.dump(), run);
    CHECK(older.find("drew the same blocks every epoch") != std::string::npos);
    CHECK(older.find("issue") == std::string::npos);
    for (const json& unknown : {json("per-epoch-v9"), json(5)}) {
      CAPTURE(unknown.dump());
      json newer = json::parse(run);
      newer["mixture_draws"] = unknown;
      const std::string why = data::data_identity_change(newer.dump(), run);
      CHECK(why.find("mixture_draws " + unknown.dump() + ", unknown here") != std::string::npos);
      CHECK(why.find("same blocks") == std::string::npos);
      CHECK(data::data_identity_change(newer.dump(), run, data::DataUse::Read) == "");
    }
  }

  // A glob matching a shard and its link or copy trained on it twice as often, silently: refused
  // within one set as across sets, naming both.
  TEST_CASE("a link or a copy inside one training set is refused naming both") {
    const fs::path d = fresh_dir("normlab_shards", "same_in_set");
    write_nanogpt(d / "ng_0.bin", 3000, 200, 1);
    write_nanogpt(d / "ng_1.bin", 3000, 200, 2);  // same size, other bytes: fine
    write_nanogpt(d / "valid.bin", 1000, 200, 3);
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "nanogpt";
    cfg.vocab_size = 200;
    cfg.lm_block = 16;
    cfg.train = (d / "ng_*.bin").string();
    cfg.valid = (d / "valid.bin").string();
    std::ostringstream log;
    CHECK_NOTHROW(data::load_dataset(cfg, log));
    data::DataConfig mixture = cfg;
    mixture.train.clear();
    mixture.mixture = {cfg.train};
    mixture.mixture_weights = {1};
    CHECK_NOTHROW(data::load_dataset(mixture, log));
    const std::string first = (d / "ng_0.bin").string();
    for (const auto& [name, how] :
         {std::pair{"ng_2.bin", std::string("the same file (a link)")},
          {"ng_3.bin", std::string("the same file (a link)")},
          {"ng_4.bin", "a copy: SHA-256 " + util::sha256_file(first).substr(0, 12)}}) {
      CAPTURE(name);
      const fs::path dup = d / name;
      if (std::string(name) == "ng_2.bin") fs::create_hard_link(first, dup);
      if (std::string(name) == "ng_3.bin") fs::create_symlink(first, dup);
      if (std::string(name) == "ng_4.bin") fs::copy_file(first, dup);
      CHECK_THROWS_WITH_AS(
          data::load_dataset(cfg, log),
          doctest::Contains(doctest::String(
              fmt::format("data.train '{}': '{}' is the same data as '{}' in it ({}", cfg.train,
                          dup.string(), first, how)
                  .c_str())),
          data::DataError);
      CHECK_THROWS_WITH_AS(data::load_dataset(mixture, log),
                           doctest::Contains(doctest::String(
                               fmt::format("data.mixture[1]: '{}' is the same data as '{}' in it",
                                           dup.string(), first)
                                   .c_str())),
                           data::DataError);
      fs::remove(dup);
    }
  }

  // A mixture's blocks are random draws: "sequential" was accepted and shown, and not done.
  TEST_CASE("data.sampling = sequential with a mixture is refused naming both keys") {
    const fs::path d = fresh_dir("normlab_shards", "sequential_mixture");
    write_nanogpt(d / "a.bin", 3000, 200, 1);
    write_nanogpt(d / "valid.bin", 1000, 200, 3);
    data::DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "nanogpt";
    cfg.vocab_size = 200;
    cfg.lm_block = 16;
    cfg.mixture = {(d / "a.bin").string()};
    cfg.mixture_weights = {1};
    cfg.valid = (d / "valid.bin").string();
    cfg.sampling = "sequential";
    std::ostringstream log;
    const std::string why = error_text([&] { data::load_dataset(cfg, log); });
    CHECK(why.find("data.sampling = \"sequential\" with data.mixture") != std::string::npos);
    cfg.sampling = "random";
    CHECK_NOTHROW(data::load_dataset(cfg, log));
  }

  // A broken shards.json said `format: expected "normlab.shards"`; a bad "tokenizer" not its value.
  TEST_CASE("a malformed shards.json says where it is not JSON; a bad tokenizer echoes it") {
    const fs::path d = fresh_dir("normlab_shards", "bad_json");
    data::ShardSet set;
    set.vocab_size = 200;
    set.eos_id = 0;
    set.shards.push_back({"shard_000.bin", 3000, std::string(64, 'a'), 199});
    const std::string good = data::shard_set_json(set);
    for (const auto& [name, text] : {std::pair{"truncated", good.substr(0, good.size() / 2)},
                                     {"trailing", good + "}x"},
                                     {"empty", std::string()}}) {
      CAPTURE(name);
      std::ofstream(d / "shards.json", std::ios::trunc) << text;
      const std::string why = error_text([&] { data::read_shard_set(d); });
      CHECK(why.find((d / "shards.json").string() + ": not valid JSON at byte ") == 0);
      CHECK(why.find("normlab.shards") == std::string::npos);
    }
    json j = json::parse(good);
    j["tokenizer"] = "../etc/\x01tok.model" + std::string(200, 'x');
    std::ofstream(d / "shards.json", std::ios::trunc) << j.dump();
    const std::string why = error_text([&] { data::read_shard_set(d); });
    CHECK(why.find("tokenizer: expected the file name of a SentencePiece model in the same folder, "
                   "got \"../etc/\\u0001tok.model") != std::string::npos);
    CHECK(why.size() < 400);
  }
}

}  // namespace normlab_test_lm_shards
