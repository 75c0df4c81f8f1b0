#include "normlab/analysis/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace normlab::analysis {
namespace {

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr auto kCrc32cTable = make_crc32c_table();

// Protobuf wire format: varints, fixed little-endian, length-delimited fields.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, 1);
  put_le(out, bits, 8);
}
void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_tag(out, field, 5);
  put_le(out, bits, 4);
}
void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // int64: negative values take 10 bytes
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

uint32_t crc32c(const void* data, std::size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, std::size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

double unix_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    throw std::runtime_error("tensorboard: cannot create directory " + dir.string() +
                             (ec ? ": " + ec.message() : std::string()));
  const auto seconds = static_cast<long long>(unix_time_now());
  file_ = dir / ("events.out.tfevents." + std::to_string(seconds) + "." + hostname() + "." +
                 std::to_string(static_cast<long long>(getpid())) + ".normlab");
  out_ = std::fopen(file_.c_str(), "wb");
  if (!out_)
    throw std::runtime_error("tensorboard: cannot create " + file_.string() + ": " +
                             std::strerror(errno));
  std::string event;
  put_double(event, 1, unix_time_now());
  put_bytes(event, 3, "brain.Event:2");  // Event.file_version
  write_record(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (out_) std::fclose(out_);
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value,
                               double wall_time) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);                        // Summary.Value.tag
  put_float(summary_value, 2, static_cast<float>(value));  // Summary.Value.simple_value
  std::string summary;
  put_bytes(summary, 1, summary_value);  // Summary.value
  std::string event;
  put_double(event, 1, wall_time);  // Event.wall_time
  put_int64(event, 2, step);        // Event.step
  put_bytes(event, 5, summary);     // Event.summary
  write_record(event);
}

void TensorBoardWriter::flush() {
  if (std::fflush(out_) != 0)
    throw std::runtime_error("tensorboard: cannot write " + file_.string() + ": " +
                             std::strerror(errno));
}

// TFRecord: uint64 length, masked crc32c(length), data, masked crc32c(data); little-endian.
void TensorBoardWriter::write_record(const std::string& data) {
  std::string header;
  put_le(header, data.size(), 8);
  std::string record = header;
  put_le(record, masked_crc32c(header.data(), header.size()), 4);
  record += data;
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  if (std::fwrite(record.data(), 1, record.size(), out_) != record.size())
    throw std::runtime_error("tensorboard: cannot write " + file_.string() + ": " +
                             std::strerror(errno));
  flush();
}

}  // namespace normlab::analysis
