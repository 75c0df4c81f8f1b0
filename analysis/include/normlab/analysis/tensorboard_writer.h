// TensorBoard event files for scalars, without LibTorch or a protobuf library: the few Event /
// Summary fields are encoded by hand and framed as TFRecords (length, masked CRC32C, data, CRC).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace normlab::analysis {

// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses it.
uint32_t crc32c(const void* data, std::size_t size, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s) { return crc32c(s.data(), s.size()); }
// TFRecord's masked CRC: rotate right by 15, add 0xa282ead8.
uint32_t masked_crc32c(const void* data, std::size_t size);

// Seconds since the Unix epoch, with sub-second precision.
double unix_time_now();

class TensorBoardWriter {
 public:
  // Creates `dir` (and parents) and events.out.tfevents.<unix time>.<hostname>.<pid>.normlab in
  // it, starting with the file_version event. Throws std::runtime_error naming the path.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar event (simple_value is a float32, as TensorBoard stores it). Written through:
  // each record is flushed to the OS, so a killed run keeps what it wrote.
  void scalar(const std::string& tag, int64_t step, double value,
              double wall_time = unix_time_now());
  void flush();
  const std::filesystem::path& file() const { return file_; }

 private:
  void write_record(const std::string& data);

  std::filesystem::path file_;
  std::FILE* out_ = nullptr;
};

}  // namespace normlab::analysis
