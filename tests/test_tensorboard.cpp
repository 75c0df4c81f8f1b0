// TensorBoard event files: CRC32C against the RFC 3720 vectors, TFRecord framing and the hand-made
// protobuf read back here. check_tensorboard.py reads the same events with the real TensorBoard.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/analysis/tensorboard_writer.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_tensorboard {

namespace fs = std::filesystem;
using normlab::analysis::crc32c;
using normlab::analysis::masked_crc32c;
using normlab::analysis::TensorBoardWriter;

namespace {

// Kept identical to EXPECTED in tests/check_tensorboard.py.
struct Scalar {
  const char* tag;
  int64_t step;
  double value;
};
constexpr Scalar kScalars[] = {
    {"train/loss", 0, 10.5},
    {"train/loss", 1, 7.25},
    {"train/loss", 2, 3.1415926535},
    {"train/lr", 0, 1e-7},
    {"train/lr", 4000, 7e-4},
    {"eval/bleu", 8589934592LL, 35.125},
    {"eval/bleu", 8589934593LL, -0.0625},
    {"misc/ünïcode tag", 7, 123456.789},
};

uint32_t get_le(const std::string& s, std::size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s.at(at + i));
  return static_cast<uint32_t>(v);
}

// The TFRecords of a file, each checked: length, masked CRC of the length, data, masked CRC.
std::vector<std::string> read_records(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < bytes.size()) {
    REQUIRE(at + 12 <= bytes.size());
    const uint64_t length = get_le(bytes, at, 4) | (uint64_t{get_le(bytes, at + 4, 4)} << 32);
    CHECK(get_le(bytes, at + 8, 4) == masked_crc32c(bytes.data() + at, 8));
    REQUIRE(at + 12 + length + 4 <= bytes.size());
    std::string data = bytes.substr(at + 12, length);
    CHECK(get_le(bytes, at + 12 + length, 4) == masked_crc32c(data.data(), data.size()));
    records.push_back(std::move(data));
    at += 12 + length + 4;
  }
  return records;
}

// A minimal protobuf reader: field number -> raw values (varints as numbers, others as bytes).
struct Field {
  uint64_t number = 0;
  std::string bytes;
};
std::multimap<uint32_t, Field> parse(const std::string& msg) {
  std::multimap<uint32_t, Field> fields;
  std::size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const auto b = static_cast<unsigned char>(msg.at(at++));
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (at < msg.size()) {
    const uint64_t key = varint();
    Field f;
    switch (key & 7) {
      case 0:
        f.number = varint();
        break;
      case 1:
        f.bytes = msg.substr(at, 8);
        at += 8;
        break;
      case 2: {
        const auto n = varint();
        f.bytes = msg.substr(at, n);
        at += n;
        break;
      }
      case 5:
        f.bytes = msg.substr(at, 4);
        at += 4;
        break;
      default:
        FAIL("unexpected wire type " << (key & 7));
    }
    REQUIRE(at <= msg.size());
    fields.emplace(static_cast<uint32_t>(key >> 3), f);
  }
  return fields;
}
template <typename T>
T as(const std::string& bytes) {
  REQUIRE(bytes.size() == sizeof(T));
  T v;
  std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}

fs::path fresh_temp_dir(const std::string& name) {
  const auto dir =
      fs::temp_directory_path() / ("normlab_test_" + name + "_" + std::to_string(std::rand()));
  fs::remove_all(dir);
  return dir;
}

}  // namespace

TEST_SUITE("tensorboard") {
  TEST_CASE("crc32c matches the RFC 3720 vectors") {
    CHECK(crc32c("") == 0u);
    CHECK(crc32c("123456789") == 0xE3069283u);
    std::array<unsigned char, 32> buf{};
    CHECK(crc32c(buf.data(), buf.size()) == 0x8A9136AAu);
    buf.fill(0xFF);
    CHECK(crc32c(buf.data(), buf.size()) == 0x62A8AB43u);
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(i);
    CHECK(crc32c(buf.data(), buf.size()) == 0x46DD794Eu);
    for (int i = 0; i < 32; ++i) buf[i] = static_cast<unsigned char>(31 - i);
    CHECK(crc32c(buf.data(), buf.size()) == 0x113FDB5Cu);
    // incremental == one shot
    CHECK(crc32c("6789", 4, crc32c("12345")) == 0xE3069283u);
    // mask: rotate right 15, add 0xa282ead8
    const uint32_t c = 0xE3069283u;
    CHECK(masked_crc32c("123456789", 9) ==
          static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8u));
  }

  TEST_CASE("file name, version event, framing and scalar events") {
    const auto dir = fresh_temp_dir("tb") / "nested" / "run";
    {
      TensorBoardWriter w(dir);
      CHECK(w.file().parent_path() == dir);
      const auto name = w.file().filename().string();
      CHECK(name.rfind("events.out.tfevents.", 0) == 0);
      CHECK(name.size() > 7);
      CHECK(name.substr(name.size() - 8) == ".normlab");
      w.scalar("a/b", 3, 0.5, 1700000000.25);
      w.scalar("neg", -2, -1.5, 1700000001.0);
      // written through: readable before flush() or destruction
      CHECK(read_records(w.file()).size() == 3);
    }
    const auto files = std::vector<fs::path>(fs::directory_iterator(dir), fs::directory_iterator());
    REQUIRE(files.size() == 1);
    const auto records = read_records(files[0]);
    REQUIRE(records.size() == 3);

    const auto version = parse(records[0]);
    REQUIRE(version.count(1) == 1);
    CHECK(as<double>(version.find(1)->second.bytes) > 1.6e9);
    REQUIRE(version.count(3) == 1);
    CHECK(version.find(3)->second.bytes == "brain.Event:2");

    const auto ev = parse(records[1]);
    CHECK(as<double>(ev.find(1)->second.bytes) == 1700000000.25);
    CHECK(ev.find(2)->second.number == 3u);
    const auto summary = parse(ev.find(5)->second.bytes);
    REQUIRE(summary.count(1) == 1);
    const auto value = parse(summary.find(1)->second.bytes);
    CHECK(value.find(1)->second.bytes == "a/b");
    CHECK(as<float>(value.find(2)->second.bytes) == 0.5f);

    const auto neg = parse(records[2]);
    CHECK(static_cast<int64_t>(neg.find(2)->second.number) == -2);
    CHECK(
        as<float>(
            parse(parse(neg.find(5)->second.bytes).find(1)->second.bytes).find(2)->second.bytes) ==
        -1.5f);
    fs::remove_all(dir.parent_path().parent_path());
  }

  TEST_CASE("errors name the path") {
    const auto base = fresh_temp_dir("tb_err");
    fs::create_directories(base);
    std::ofstream(base / "a_file") << "x";
    const auto bad = base / "a_file" / "sub";
    try {
      TensorBoardWriter w(bad);
      FAIL("no exception");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()).find(bad.string()) != std::string::npos);
    }
    fs::remove_all(base);
  }

  // With NORMLAB_TB_OUT set (ctest tensorboard_write), the events stay there for
  // check_tensorboard.py; without it they go to a temp dir that is read back and removed.
  TEST_CASE("writes events for the python check") {
    const char* env = std::getenv("NORMLAB_TB_OUT");
    const fs::path dir = env && *env ? fs::path(env) : fresh_temp_dir("tb_py");
    if (fs::is_directory(dir))  // only this writer's files, so the check sees one run
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
          fs::remove(e.path());
    fs::path file;
    {
      TensorBoardWriter w(dir);
      file = w.file();
      for (const auto& s : kScalars) w.scalar(s.tag, s.step, s.value);
      w.flush();
    }
    const auto records = read_records(file);
    CHECK(records.size() == 1 + std::size(kScalars));
    if (!(env && *env)) fs::remove_all(dir);
  }

}  // TEST_SUITE

}  // namespace normlab_test_tensorboard
