#include "normlab/data/named_datasets.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "data/dataset_recipes.h"
#include "normlab/data/dataset.h"
#include "util/atomic_file.h"
#include "util/file_lock.h"

namespace fs = std::filesystem;

namespace normlab::data {
namespace {

// A download whose content is wrong (corrupt, truncated, another file): fetch_dataset removes the
// downloads, so the next run fetches them again instead of reusing them forever.
struct BadDownload : DataError {
  using DataError::DataError;
};

std::string basename_of(const std::string& url) { return url.substr(url.find_last_of('/') + 1); }

// One URL path segment, percent-encoded (a space, '%' or '/' inside a folder name stay themselves).
std::string escaped(const std::string& segment) {
  char* e = curl_easy_escape(nullptr, segment.c_str(), int(segment.size()));
  std::string out = e ? e : segment;
  curl_free(e);
  return out;
}

std::string file_url(const fs::path& p) {
  std::string url = "file://";
  for (const auto& part : p.lexically_normal())
    if (part != "/") url += "/" + escaped(part.string());
  return url;
}

// $NORMLAB_DATA_MIRROR: a folder or a URL holding NAME/<file name of each download>. A folder
// may hold a .gz download's file uncompressed instead (unpacking reads plain bytes as they are).
std::string source_url(const std::string& dataset, const std::string& url) {
  const char* mirror = std::getenv("NORMLAB_DATA_MIRROR");
  if (!mirror || !*mirror) return url;
  std::string base(mirror);
  const std::string name = basename_of(url);
  if (base.find("://") == std::string::npos) {
    const fs::path folder = fs::absolute(base) / dataset;
    std::error_code ec;
    const std::string plain = name.size() > 3 && name.substr(name.size() - 3) == ".gz"
                                  ? name.substr(0, name.size() - 3)
                                  : "";
    if (!fs::exists(folder / name, ec) && !plain.empty() && fs::is_regular_file(folder / plain, ec))
      return file_url(folder / plain);
    // A missing folder or file is the mirror's fault, not a download to resume (issue 42.19).
    if (!fs::is_regular_file(folder / name, ec))
      throw DataError(fmt::format(
          "dataset {}: NORMLAB_DATA_MIRROR={}: {} {}; expected the folder to hold {}/{}{} (or "
          "unset NORMLAB_DATA_MIRROR to download from the source)",
          dataset, mirror,
          !fs::is_directory(fs::absolute(base), ec) ? fs::absolute(base).string()
          : !fs::is_directory(folder, ec)           ? folder.string()
                                                    : (folder / name).string(),
          !fs::is_directory(fs::absolute(base), ec) || !fs::is_directory(folder, ec)
              ? "is not a folder"
              : "does not exist",
          dataset, name, plain.empty() ? "" : fmt::format(" or {}/{}", dataset, plain)));
    return file_url(folder / name);
  }
  while (!base.empty() && base.back() == '/') base.pop_back();
  return fmt::format("{}/{}/{}", base, escaped(dataset), escaped(name));
}

std::string human_bytes(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.0f} kB", b / 1e3);
  return fmt::format("{:.0f} B", b);  // a small file is not "0 kB"
}

struct Transfer {
  std::FILE* file = nullptr;
  std::ostream* log = nullptr;
  std::string label;
  curl_off_t resumed_from = 0;
  std::chrono::steady_clock::time_point last_print{};
  bool printed = false;
};

size_t write_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  return std::fwrite(data, size, n, t->file) * size;
}

int show_progress(void* user, curl_off_t total, curl_off_t now, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (now == 0 && total == 0) return 0;  // nothing known yet: no "0 B" line
  const auto clock = std::chrono::steady_clock::now();
  if (clock - t->last_print < std::chrono::milliseconds(500)) return 0;
  t->last_print = clock;
  const double done = double(now + t->resumed_from), all = double(total + t->resumed_from);
  if (total > 0)
    *t->log << fmt::format("\r  {}: {:3.0f}% of {}", t->label, 100.0 * done / all, human_bytes(all))
            << std::flush;
  else
    *t->log << fmt::format("\r  {}: {}", t->label, human_bytes(done)) << std::flush;
  t->printed = true;
  return 0;
}

// `url` into `target`, through target.part (kept on failure and resumed next time).
void download(const std::string& dataset, const std::string& url, const fs::path& target,
              std::ostream& log) {
  static std::once_flag curl_init;
  std::call_once(curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  const fs::path part = target.string() + ".part";
  std::error_code ec;
  const curl_off_t have = fs::exists(part, ec) ? curl_off_t(fs::file_size(part, ec)) : 0;
  Transfer t;
  t.log = &log;
  t.label = basename_of(url);
  t.resumed_from = have;
  t.file = std::fopen(part.c_str(), have > 0 ? "ab" : "wb");
  if (!t.file) throw DataError(fmt::format("dataset {}: cannot write {}", dataset, part.string()));
  if (have > 0) log << fmt::format("  {}: resuming after {}\n", t.label, human_bytes(double(have)));
  CURL* c = curl_easy_init();
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);  // stalled for a minute: give up (resumable)
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
  curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, have);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, show_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "normlab");
  const CURLcode rc = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(c);
  const bool write_ok = std::fflush(t.file) == 0 && fsync(fileno(t.file)) == 0;
  std::fclose(t.file);
  if (t.printed)  // the real size at the end (file:// and chunked transfers announce none)
    log << fmt::format("\r  {}: {}\n", t.label, human_bytes(double(fs::file_size(part, ec))));
  const bool unresumable =
      have > 0 && (rc == CURLE_RANGE_ERROR || rc == CURLE_BAD_DOWNLOAD_RESUME ||
                   (rc == CURLE_HTTP_RETURNED_ERROR && status == 416));
  if (unresumable) {
    // The partial file is as long as the remote one or longer (the file was replaced): it can
    // never be resumed (HTTP 416 forever). Discard it and download the whole file once more.
    fs::remove(part, ec);
    log << fmt::format("  {}: the partial download cannot be resumed ({}); starting over\n",
                       t.label, status == 416 ? "HTTP 416" : curl_easy_strerror(rc));
    return download(dataset, url, target, log);
  }
  if (rc == CURLE_RANGE_ERROR || (rc == CURLE_OK && have > 0 && status == 200)) {
    // The server ignored or refused the range: the bytes appended are a whole file. Start over.
    fs::remove(part, ec);
    throw DataError(fmt::format(
        "dataset {}: {} cannot be resumed; removed the partial file, run again", dataset, url));
  }
  if (rc != CURLE_OK) {
    const std::uintmax_t got = fs::exists(part, ec) ? fs::file_size(part, ec) : 0;
    throw DataError(
        fmt::format("dataset {}: download of {} failed after {} ({}); run again to resume{}",
                    dataset, url, human_bytes(double(got)), *error ? error : curl_easy_strerror(rc),
                    std::getenv("NORMLAB_DATA_MIRROR") ? "" : ", or set NORMLAB_DATA_MIRROR"));
  }
  if (!write_ok)
    throw DataError(fmt::format("dataset {}: cannot write {}", dataset, part.string()));
  fs::rename(part, target, ec);
  if (ec)
    throw DataError(
        fmt::format("dataset {}: cannot rename {}: {}", dataset, part.string(), ec.message()));
}

// Reads `archive_path` with libarchive (raw gzip, or any archive format) and writes the members
// named in `members` (path → file under `dir`). Throws DataError for a truncated or corrupt file.
void unpack(const std::string& dataset, const fs::path& archive_path, const Download& d,
            const fs::path& dir) {
  struct archive* a = archive_read_new();
  // Only what the catalogue needs: gzip (.gz, .tgz) by zlib, tar and zip. filter_all would also
  // run external programs (lzop -d, lrzip -d, …) from PATH for downloaded bytes with their magic.
  archive_read_support_filter_gzip(a);
  if (d.unpack == Unpack::Gunzip) {
    archive_read_support_format_raw(a);
  } else {
    archive_read_support_format_tar(a);
    archive_read_support_format_zip(a);
  }
  auto fail = [&](const std::string& what) {
    const std::string msg = fmt::format("dataset {}: {}: {} (truncated or corrupt download)",
                                        dataset, archive_path.filename().string(), what);
    archive_read_free(a);
    throw BadDownload(msg);
  };
  if (archive_read_open_filename(a, archive_path.c_str(), 1 << 16) != ARCHIVE_OK)
    fail(archive_error_string(a));
  std::map<std::string, std::string> wanted;
  if (d.unpack == Unpack::Gunzip) wanted["data"] = d.file;
  for (const auto& [member, file] : d.members) wanted[member] = file;
  std::set<std::string> found;
  uint64_t written = 0;
  struct archive_entry* entry = nullptr;
  int r;
  std::vector<char> buf(1 << 16);
  while ((r = archive_read_next_header(a, &entry)) == ARCHIVE_OK) {
    // A gzip file is one entry, named "data" or by the name its header stores (gzip's default):
    // either way it is the file.
    auto it =
        d.unpack == Unpack::Gunzip ? wanted.begin() : wanted.find(archive_entry_pathname(entry));
    if (it == wanted.end()) {
      if (archive_read_data_skip(a) != ARCHIVE_OK) fail(archive_error_string(a));
      continue;
    }
    if (!found.insert(it->first).second) fail(fmt::format("member {} appears twice", it->first));
    if (d.unpack == Unpack::Archive && archive_entry_filetype(entry) != AE_IFREG)
      fail(fmt::format("member {} is not a regular file (a link or a folder)", it->first));
    const fs::path out = dir / it->second;
    fs::create_directories(out.parent_path());
    std::ofstream f(out, std::ios::binary);
    la_ssize_t n;
    while ((n = archive_read_data(a, buf.data(), buf.size())) > 0) {
      written += uint64_t(n);
      if (d.max_unpacked_bytes > 0 && written > d.max_unpacked_bytes)
        fail(fmt::format("unpacks to more than {}, far beyond the dataset's size",
                         human_bytes(double(d.max_unpacked_bytes))));
      f.write(buf.data(), n);
      if (!f) break;
    }
    if (n < 0) fail(archive_error_string(a) ? archive_error_string(a) : "read error");
    f.close();
    if (!f) {
      const int err = errno;
      throw DataError(fmt::format("dataset {}: cannot write {}: {}", dataset, out.string(),
                                  std::strerror(err)));
    }
  }
  if (r != ARCHIVE_EOF) fail(archive_error_string(a) ? archive_error_string(a) : "read error");
  archive_read_free(a);
  if (found.size() != wanted.size()) {
    std::string missing;
    for (const auto& [member, file] : wanted)
      if (!fs::exists(dir / file)) missing += (missing.empty() ? "" : ", ") + member;
    throw BadDownload(
        fmt::format("dataset {}: {} lacks {}", dataset, archive_path.filename().string(), missing));
  }
}

std::vector<std::string> read_lines(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(std::move(line));
  }
  return out;
}

void write_lines(const fs::path& p, const std::vector<std::string>& lines) {
  std::ofstream out(p, std::ios::binary);
  for (const auto& l : lines) out << l << '\n';
  if (!out.flush()) throw DataError(fmt::format("cannot write {}", p.string()));
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void erase_all(std::string& s, const std::string& what) {
  for (size_t p; (p = s.find(what)) != std::string::npos;) s.erase(p, what.size());
}

size_t words(const std::string& s) {
  std::istringstream in(s);
  size_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

// fairseq's prepare-iwslt14.sh on raw text: the metadata lines of train.tags dropped and the
// title/description tags stripped, pairs cleaned as Moses clean-corpus-n.perl (1..175 words, length
// ratio ≤ 1.5, counted in whitespace words here: fairseq counts Moses tokens), every 23rd pair is
// valid; test = the <seg> lines of dev2010, dev2012, tst2010, tst2011, tst2012.
void iwslt14_split(const fs::path& dir) {
  std::map<std::string, std::vector<std::string>> train;
  for (const char* lang : {"de", "en"}) {
    std::vector<std::string> kept;
    for (std::string line : read_lines(dir / "orig" / fmt::format("train.tags.de-en.{}", lang))) {
      bool meta = false;
      for (const char* tag : {"<url>", "<talkid>", "<keywords>", "<speaker>", "<reviewer",
                              "<translator", "<doc", "</doc>"})
        meta = meta || line.find(tag) != std::string::npos;
      if (meta) continue;
      for (const char* tag : {"<title>", "</title>", "<description>", "</description>"})
        erase_all(line, tag);
      kept.push_back(trim(line));
    }
    train[lang] = std::move(kept);
  }
  if (train["de"].size() != train["en"].size())
    throw DataError(fmt::format("dataset iwslt14: train.tags has {} German and {} English lines",
                                train["de"].size(), train["en"].size()));
  std::map<std::string, std::vector<std::string>> tr, va, te;
  size_t nr = 0;
  for (size_t i = 0; i < train["de"].size(); ++i) {
    const size_t a = words(train["de"][i]), b = words(train["en"][i]);
    if (a < 1 || b < 1 || a > 175 || b > 175 || double(a) > 1.5 * double(b) ||
        double(b) > 1.5 * double(a))
      continue;
    auto& dst = (++nr % 23 == 0) ? va : tr;
    for (const char* lang : {"de", "en"}) dst[lang].push_back(train[lang][i]);
  }
  for (const char* lang : {"de", "en"}) {
    for (const auto& t : kIwsltTestSets)
      for (std::string line : read_lines(dir / "orig" / fmt::format("{}.{}.xml", t, lang))) {
        const auto open = line.find("<seg id");
        if (open == std::string::npos) continue;
        const auto start = line.find('>', open);
        const auto end = line.find("</seg>", start);
        std::string seg =
            line.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1);
        for (size_t p; (p = seg.find("\xE2\x80\x99")) != std::string::npos;) seg.replace(p, 3, "'");
        te[lang].push_back(trim(seg));
      }
    write_lines(dir / fmt::format("train.{}", lang), tr[lang]);
    write_lines(dir / fmt::format("valid.{}", lang), va[lang]);
    write_lines(dir / fmt::format("test.{}", lang), te[lang]);
  }
  fs::remove_all(dir / "orig");
}

}  // namespace

fs::path datasets_root() {
  if (const char* dir = std::getenv("NORMLAB_DATA_DIR"); dir && *dir) return fs::path(dir);
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "normlab" / "data" / "datasets";
  return fs::temp_directory_path() / "normlab-cache" / "data" / "datasets";
}

fs::path dataset_dir(const std::string& name) { return datasets_root() / recipe(name).info.name; }

bool dataset_present(const std::string& name) {
  std::error_code ec;
  return fs::is_regular_file(dataset_dir(name) / "SHA256SUMS", ec);
}

namespace {

// An installed dataset's files must still have the sizes recorded when it was fetched (a truncated
// train.en once still counted as fetched). Folders fetched before SIZES existed are taken as they
// are.
void check_installed(const std::string& name, const fs::path& dest) {
  std::ifstream in(dest / "SIZES");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    uint64_t want = 0;
    std::string file;
    if (!(ls >> want >> file)) continue;
    std::error_code ec;
    const uint64_t got = fs::file_size(dest / file, ec);
    if (ec || got != want)
      throw DataError(fmt::format(
          "dataset {}: {} is {} bytes, {} when it was fetched (damaged); remove {} and fetch "
          "it again (normlab data fetch {})",
          name, (dest / file).string(), ec ? 0 : got, want, dest.string(), name));
  }
}

}  // namespace

fs::path fetch_dataset(const std::string& name, std::ostream& log) {
  const Recipe& r = recipe(name);
  const fs::path root = datasets_root(), dest = root / name;
  if (dataset_present(name)) {
    check_installed(name, dest);
    return dest;
  }
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    throw DataError(
        fmt::format("dataset {}: cannot create {}: {}", name, root.string(), ec.message()));
  // One fetcher per dataset (sweep workers may start together); the others wait for it.
  int holder = 0;
  std::optional<util::FileLock> lock;
  for (int waited = 0;
       !(lock = util::FileLock::try_acquire(root / fmt::format(".{}.lock", name), &holder));
       ++waited) {
    if (waited == 0)
      log << fmt::format("dataset {}: waiting for process {} to fetch it\n", name, holder);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (dataset_present(name)) return dest;
  // Unpack folders of a fetch that was killed (only the lock's holder makes them: all are stale).
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind(fmt::format(".{}.tmp-", name), 0) == 0)
      fs::remove_all(e.path(), ec);

  const fs::path downloads = root / ".downloads" / name;
  fs::create_directories(downloads, ec);
  log << fmt::format("dataset {}: fetching {} file(s){}\n", name, r.downloads.size(),
                     std::getenv("NORMLAB_DATA_MIRROR") ? " from NORMLAB_DATA_MIRROR" : "");
  for (const auto& d : r.downloads) {
    const fs::path file = downloads / basename_of(d.url);
    if (!fs::exists(file, ec)) download(name, source_url(name, d.url), file, log);
  }

  std::string tmpl = (root / fmt::format(".{}.tmp-XXXXXX", name)).string();
  if (!mkdtemp(tmpl.data()))
    throw DataError(fmt::format("dataset {}: cannot create a folder in {}", name, root.string()));
  const fs::path tmp(tmpl);
  try {
    for (const auto& d : r.downloads) unpack(name, downloads / basename_of(d.url), d, tmp);
    if (name == "iwslt14") {
      try {
        iwslt14_split(tmp);
      } catch (const DataError& e) {  // a readable archive with other content than the corpus's
        throw BadDownload(e.what());
      }
    }
    const auto pins = pinned_sums(name);
    std::string sums, unverified;
    for (const auto& f : r.info.files) {
      const std::string got = util::sha256_file(tmp / f);
      auto pin = pins.find(f);
      if (pin == pins.end()) {
        unverified += (unverified.empty() ? "" : ", ") + f;
      } else if (pin->second != got) {
        throw BadDownload(fmt::format(
            "dataset {}: {}: SHA-256 mismatch (expected {}, got {}); the download is corrupt "
            "or truncated",
            name, f, pin->second, got));
      }
      sums += fmt::format("{}  {}\n", got, f);
    }
    if (!unverified.empty())
      log << fmt::format(
          "dataset {}: warning: no SHA-256 pinned in scripts/datasets/{}.sha256 for {}: unverified "
          "(SHA256SUMS in the dataset folder records what was fetched)\n",
          name, name, unverified);
    write_lines(tmp / "SHA256SUMS", {sums.substr(0, sums.empty() ? 0 : sums.size() - 1)});
    std::vector<std::string> sizes;
    for (const auto& f : r.info.files)
      sizes.push_back(fmt::format("{}  {}", fs::file_size(tmp / f), f));
    write_lines(tmp / "SIZES", sizes);
    fs::rename(tmp, dest, ec);
    if (ec)
      throw DataError(
          fmt::format("dataset {}: cannot move it into {} ({}); remove that folder and fetch again",
                      name, dest.string(), ec.message()));
  } catch (const BadDownload& e) {
    fs::remove_all(tmp, ec);
    fs::remove_all(downloads, ec);
    throw DataError(
        fmt::format("{}; removed the download {}, run again", e.what(), downloads.string()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(downloads, ec);
  log << fmt::format("dataset {}: ready in {}\n", name, dest.string());
  return dest;
}

void resolve_named_dataset(DataConfig& cfg, std::ostream& log) {
  if (cfg.dataset.empty()) return;
  const Recipe& r = recipe(cfg.dataset);
  const fs::path dir = fetch_dataset(cfg.dataset, log);
  cfg.task = r.info.task;
  auto split = [&](const char* s) { return r.splits.at(s); };
  if (r.info.task == "lm") {  // an empty split: none (validation: the tail of train)
    auto file = [&](const char* s) {
      return split(s).empty() ? std::string() : (dir / split(s)).string();
    };
    cfg.train = file("train");
    cfg.valid = file("valid");
    cfg.test = file("test");
    return;
  }
  const std::string pair = cfg.pair.empty() ? r.info.pairs.front() : cfg.pair;
  const auto dash = pair.find('-');
  if (std::find(r.info.pairs.begin(), r.info.pairs.end(), pair) == r.info.pairs.end() ||
      dash == std::string::npos)
    throw DataError(fmt::format("data.pair: dataset {} has {}, got '{}'", cfg.dataset,
                                fmt::join(r.info.pairs, " or "), pair));
  const std::string src = pair.substr(0, dash), tgt = pair.substr(dash + 1);
  cfg.train_src = (dir / (split("train") + "." + src)).string();
  cfg.train_tgt = (dir / (split("train") + "." + tgt)).string();
  cfg.valid_src = (dir / (split("valid") + "." + src)).string();
  cfg.valid_tgt = (dir / (split("valid") + "." + tgt)).string();
  cfg.test_src = (dir / (split("test") + "." + src)).string();
  cfg.test_tgt = (dir / (split("test") + "." + tgt)).string();
}

}  // namespace normlab::data
