#include "elf_section.h"

#include <elf.h>
#include <fmt/format.h>
#include <link.h>  // ElfW: the ELF class of this machine

#include <cstring>
#include <fstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace normlab {
namespace {

using Ehdr = ElfW(Ehdr);
using Shdr = ElfW(Shdr);

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
constexpr unsigned char kNativeData = ELFDATA2LSB;
#else
constexpr unsigned char kNativeData = ELFDATA2MSB;
#endif
constexpr unsigned char kNativeClass = sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32;

// Every read is checked against the file's size first: offsets in the file are untrusted.
class BoundedFile {
 public:
  explicit BoundedFile(const fs::path& file) : in_(file, std::ios::binary) {
    std::error_code ec;
    size_ = fs::file_size(file, ec);
    if (ec || !in_) throw std::runtime_error("cannot be read");
  }
  std::string read(std::uint64_t offset, std::uint64_t count, const char* what) {
    if (offset > size_ || count > size_ - offset)
      throw std::runtime_error(
          fmt::format("truncated or damaged ELF file ({} lies outside the file)", what));
    std::string bytes(count, '\0');
    in_.seekg(std::streamoff(offset));
    if (count > 0 && !in_.read(bytes.data(), std::streamsize(count)))
      throw std::runtime_error(fmt::format("cannot read {}", what));
    return bytes;
  }
  template <class T>
  T read_struct(std::uint64_t offset, const char* what) {
    T value;
    std::memcpy(&value, read(offset, sizeof(T), what).data(), sizeof(T));
    return value;
  }

 private:
  std::ifstream in_;
  std::uint64_t size_ = 0;
};

}  // namespace

std::optional<std::string> read_elf_section(const fs::path& file, const std::string& name,
                                            std::size_t max_bytes) {
  BoundedFile f(file);
  const auto eh = f.read_struct<Ehdr>(0, "the ELF header");
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) throw std::runtime_error("not an ELF file");
  if (eh.e_ident[EI_CLASS] != kNativeClass || eh.e_ident[EI_DATA] != kNativeData)
    throw std::runtime_error("an ELF file for another word size or byte order");
  if (eh.e_shoff == 0) return std::nullopt;  // no section table
  if (eh.e_shentsize != sizeof(Shdr))
    throw std::runtime_error("damaged ELF file (section header size)");
  // Large section counts and the string table's index live in section 0 (ELF's escape values).
  const auto first = f.read_struct<Shdr>(eh.e_shoff, "the section table");
  const std::uint64_t count = eh.e_shnum != 0 ? eh.e_shnum : first.sh_size;
  const std::uint64_t names_index = eh.e_shstrndx == SHN_XINDEX ? first.sh_link : eh.e_shstrndx;
  if (count == 0 || names_index >= count) return std::nullopt;
  if (count > (std::uint64_t(1) << 20))
    throw std::runtime_error("damaged ELF file (section count)");
  const std::string table = f.read(eh.e_shoff, count * sizeof(Shdr), "the section table");
  auto section = [&](std::uint64_t i) {
    Shdr s;
    std::memcpy(&s, table.data() + i * sizeof(Shdr), sizeof(Shdr));
    return s;
  };
  const Shdr names_hdr = section(names_index);
  if (names_hdr.sh_type == SHT_NOBITS || names_hdr.sh_size > (std::uint64_t(1) << 24))
    throw std::runtime_error("damaged ELF file (section names)");
  const std::string names = f.read(names_hdr.sh_offset, names_hdr.sh_size, "the section names");
  for (std::uint64_t i = 1; i < count; ++i) {
    const Shdr s = section(i);
    if (s.sh_name >= names.size()) continue;
    const char* n = names.data() + s.sh_name;
    if (strnlen(n, names.size() - s.sh_name) != name.size() ||
        name.compare(0, name.size(), n, name.size()) != 0)
      continue;
    if (s.sh_type == SHT_NOBITS)
      throw std::runtime_error(fmt::format("section {} has no contents", name));
    if (s.sh_size > max_bytes)
      throw std::runtime_error(fmt::format("section {} is {} bytes, more than the {} expected",
                                           name, s.sh_size, max_bytes));
    return f.read(s.sh_offset, s.sh_size, "a section");
  }
  return std::nullopt;
}

}  // namespace normlab
