// Folders normlab writes into are its own: made by it, or marked by it. A folder that holds
// `.normlab-dir` ({"normlab": KIND}) was made by a normlab command of that kind (run, sweep,
// frontier, ablation, export, plots, report); any other non-empty folder is the user's and is
// never written into (issue 42.1: `run.out_dir = "/"` once wrote a whole run into /). The Python
// side (analysis/python/normlab_outdir.py) reads and writes the same marker. No LibTorch here.
#pragma once

#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>

namespace normlab::util {

inline constexpr const char* kOwnerMarker = ".normlab-dir";

// One line: the folder, what it holds, and what to do. Bad input (exit 2): nothing was written.
class DirectoryClaimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The kind in dir's marker; "" when it has none (or it is unreadable).
std::string owner_kind(const std::filesystem::path& dir);

// Whether `kind` may write into `dir` without making it: it does not exist, is empty, holds
// `kind`'s marker, or `legacy(dir)` recognises a folder an older normlab wrote before markers.
// Reads only; "" when it may, else the reason (for DirectoryClaimError).
std::string claim_problem(const std::filesystem::path& dir, const std::string& kind,
                          const std::function<bool(const std::filesystem::path&)>& legacy = {});

// Makes `dir` (with its parents) or takes it over as above, then writes the marker. Throws
// DirectoryClaimError naming `what` (e.g. "[run] out_dir") before writing anything when the folder
// is not normlab's of this kind, or when it cannot be made (the system's cause: read-only file
// system, not a directory, …).
void claim_directory(const std::filesystem::path& dir, const std::string& kind,
                     const std::string& what,
                     const std::function<bool(const std::filesystem::path&)>& legacy = {});

}  // namespace normlab::util
