// Reads one section of an ELF file from disk, without loading (mapping or running) the file:
// how the registry gets a plugin's metadata before deciding whether to load it.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace normlab {

// The bytes of section `name`, or nullopt when the file has no such section. Throws
// std::runtime_error with the reason (not the file name) when the file is not a well-formed ELF
// file of this machine's class and byte order, or the section is larger than `max_bytes`.
std::optional<std::string> read_elf_section(const std::filesystem::path& file,
                                            const std::string& name, std::size_t max_bytes);

}  // namespace normlab
