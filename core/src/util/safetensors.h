// The safetensors format (huggingface/safetensors; docs/evaluate.md): an 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end)},
// "__metadata__": {str: str}}, then the tensors' raw little-endian bytes. Pure data: reading one
// runs no code, so normlab keeps checkpoints, scheme state and exports in it. The reader checks
// every field and every byte range before it allocates, so a damaged or crafted file is one error
// naming the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace normlab::util {

class AtomicFile;

// A file that is not a valid safetensors file, or lacks what the caller needs: "FILE: what".
class TensorFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using TensorList = std::vector<std::pair<std::string, at::Tensor>>;

// Appends `tensors` (CPU copies, contiguous) and `metadata` as a safetensors file to `file`.
void write_safetensors(AtomicFile& file, const TensorList& tensors,
                       const std::map<std::string, std::string>& metadata);

class SafetensorsReader {
 public:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range inside the data section
  };

  // Reads and checks the header: sizes, JSON, dtypes, shapes, offsets in bounds and disjoint.
  // Throws TensorFileError naming the file.
  explicit SafetensorsReader(std::filesystem::path file);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // The tensor's bytes as a new CPU tensor. Throws TensorFileError when absent or unreadable.
  at::Tensor read(const std::string& name);
  // A metadata value; throws TensorFileError naming the key when absent.
  const std::string& meta(const std::string& key) const;

 private:
  std::filesystem::path path_;
  std::ifstream in_;
  uint64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// "F32", "I64", … ; throws TensorFileError for a dtype the format has no name for.
const char* safetensors_dtype_name(at::ScalarType t);
// "[64, 128]"
std::string shape_text(const std::vector<int64_t>& shape);

// True when the file starts with a zip header, as LibTorch/TorchScript archives (torch.save) do.
bool is_zip_archive(const std::filesystem::path& file);

}  // namespace normlab::util
