#include "safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "atomic_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab::util {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian bytes");

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr size_t kMaxRank = 16;

struct DtypeName {
  const char* name;
  at::ScalarType type;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

// Brackets nested deeper than a header ever needs (3) are refused before parsing.
bool nesting_within(const std::string& text, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

bool as_u64(const json& v, uint64_t& out) {
  if (!v.is_number_unsigned()) return false;
  out = v.get<uint64_t>();
  return true;
}

}  // namespace

const char* safetensors_dtype_name(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d.name;
  throw TensorFileError(fmt::format("safetensors has no dtype for {}", c10::toString(t)));
}

std::string shape_text(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

bool is_zip_archive(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}

void write_safetensors(AtomicFile& file, const TensorList& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> data;
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = uint64_t(c.numel()) * c.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(c.scalar_type())},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t n = text.size();
  file.append(&n, sizeof n);
  file.append(text);
  for (const at::Tensor& c : data) file.append(c.data_ptr(), size_t(c.numel()) * c.element_size());
}

SafetensorsReader::SafetensorsReader(fs::path file) : path_(std::move(file)) {
  auto fail = [&](const std::string& what) {
    return TensorFileError(fmt::format("{}: {}", path_.string(), what));
  };
  std::error_code ec;
  if (fs::is_directory(path_, ec)) throw fail("is a directory, expected a safetensors file");
  const uint64_t size = fs::file_size(path_, ec);
  if (ec) throw fail(ec.message());
  in_.open(path_, std::ios::binary);
  if (!in_) throw fail("cannot be opened");
  uint64_t n = 0;
  if (size < 8 || !in_.read(reinterpret_cast<char*>(&n), 8))
    throw fail(fmt::format("{} bytes: too short for a safetensors header", size));
  if (n < 2 || n > kMaxHeaderBytes || n > size - 8)
    throw fail(fmt::format(
        "header length {} does not fit the file's {} bytes (not a safetensors file, or truncated)",
        n, size));
  std::string text(n, '\0');
  if (!in_.read(text.data(), std::streamsize(n))) throw fail("header cannot be read");
  if (!nesting_within(text, 3)) throw fail("header nests deeper than a safetensors header does");
  const json header = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw fail("header is not a JSON object (damaged file?)");
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ is not an object of strings");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) throw fail(fmt::format("__metadata__.{} is not a string", k));
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return fail(fmt::format("tensor '{}': {}", name, what));
    };
    if (!v.is_object() || v.size() != 3 || !v.contains("dtype") || !v.contains("shape") ||
        !v.contains("data_offsets"))
      throw bad("expected an object with dtype, shape and data_offsets");
    Entry e{};
    const json& dt = v["dtype"];
    const auto* d = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeName& x) {
      return dt.is_string() && dt.get<std::string>() == x.name;
    });
    if (d == std::end(kDtypes))
      throw bad(fmt::format("dtype {} is not one normlab reads", dt.dump()));
    e.dtype = d->type;
    const json& shape = v["shape"];
    if (!shape.is_array() || shape.size() > kMaxRank)
      throw bad("shape is not a list of at most 16 sizes");
    uint64_t numel = 1;
    for (const json& s : shape) {
      uint64_t k = 0;
      if (!as_u64(s, k) || k > (uint64_t(1) << 48))
        throw bad(fmt::format("shape entry {} is not a size", s.dump()));
      if (k != 0 && numel > data_size / k)
        numel = data_size + 1;  // already more than the file holds
      else
        numel *= k;
      e.shape.push_back(int64_t(k));
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !as_u64(off[0], e.begin) || !as_u64(off[1], e.end) ||
        e.begin > e.end)
      throw bad("data_offsets is not [begin, end] with begin <= end");
    if (e.end > data_size)
      throw bad(fmt::format("bytes [{}, {}) lie beyond the file's {} data bytes (truncated?)",
                            e.begin, e.end, data_size));
    const uint64_t want =
        numel > data_size ? data_size + 1 : numel * uint64_t(c10::elementSize(e.dtype));
    if (e.end - e.begin != want)
      throw bad(fmt::format("{} {} needs {} bytes, data_offsets give {}", d->name,
                            shape_text(e.shape), want, e.end - e.begin));
    if (e.end > e.begin) ranges.emplace_back(e.begin, e.end);
    entries_.emplace(name, std::move(e));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      throw fail("two tensors share bytes (data_offsets overlap)");
}

at::Tensor SafetensorsReader::read(const std::string& name) {
  const auto it = entries_.find(name);
  if (it == entries_.end())
    throw TensorFileError(fmt::format("{}: no tensor '{}'", path_.string(), name));
  const Entry& e = it->second;
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  if (e.end > e.begin) {
    in_.clear();
    in_.seekg(std::streamoff(data_start_ + e.begin));
    if (!in_.read(static_cast<char*>(t.data_ptr()), std::streamsize(e.end - e.begin)))
      throw TensorFileError(fmt::format("{}: tensor '{}' cannot be read", path_.string(), name));
    // A bool byte other than 0 or 1 is undefined behaviour in every kernel that reads it.
    if (e.dtype == at::kBool && t.view(at::kByte).gt(1).any().item<bool>())
      throw TensorFileError(fmt::format(
          "{}: tensor '{}' is BOOL but holds bytes other than 0 and 1", path_.string(), name));
  }
  return t;
}

const std::string& SafetensorsReader::meta(const std::string& key) const {
  const auto it = metadata_.find(key);
  if (it == metadata_.end())
    throw TensorFileError(fmt::format("{}: __metadata__ lacks '{}'", path_.string(), key));
  return it->second;
}

}  // namespace normlab::util
