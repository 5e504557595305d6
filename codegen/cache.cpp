// The compile cache of codegen::Executable: a process-wide map from cache key to JIT-linked code,
// then one file per graph and target on disk holding the object code and run()'s metadata.
// Entry layout (little-endian, see README.md): magic "KILNOBJ\0", u32 format, u32 0,
// u64 payload size, u64 xxh3 of the payload; payload = version, key, metadata, object.
#include "codegen/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "codegen/source_hash.h"  // generated (build dir)
#include "core/env.h"
#include "core/error.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/xxhash.h"

namespace kiln::codegen {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '\0'};
// 2: row-split plan in the metadata; 3: its gemm flag; 4: outputs' in-place input; 5: its
// per-row flag; 6: the runtime GEMM's rows_split argument (codegen/runtime.cpp); 7: kernel
// timers' descriptions (CPU ids, CUDA kernels); 8: an output's `?` dim as a sum of input dims
// plus a constant (DimFormula)
constexpr uint32_t kFormat = 8;
// The version is part of an entry's file name, so builds of other versions sharing a directory
// keep entries of their own (as ccache does); an entry whose stored version differs anyway is
// stale and rebuilt. The source hash (codegen/, formulas, the dialect, ...; see CMakeLists.txt)
// changes with any pipeline edit; bump the number when the entry's metadata changes meaning.
constexpr const char* kCodegenVersion =
    "kiln-codegen 1, sources " KILN_CODEGEN_SOURCE_HASH ", LLVM " LLVM_VERSION_STRING;

std::mutex g_mutex;  // guards everything below
// Weak: the code lives as long as an Executable uses it, not as long as the process (dropping a
// compiled function frees its JIT; a later equal graph links the disk entry again). Expired
// entries are swept when the map has doubled since the last sweep.
std::unordered_map<std::string, std::weak_ptr<const CompiledCode>> g_memory;
std::size_t g_memory_sweep_at = 64;
std::string g_version_override;
// Directories a write failed in: read, not written again (their entries stay valid).
std::set<std::string> g_unwritable_dirs;
std::set<std::string> g_warned;  // "<dir>\n<kind>" of the warnings printed

std::string version() {
  std::lock_guard lock(g_mutex);
  return g_version_override.empty() ? kCodegenVersion : g_version_override;
}

struct Writer {
  std::string out;
  void raw(const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    out.append(s);
  }
};

/// Bounds-checked reads; after an overrun every read returns zeros and ok is false.
struct Reader {
  std::string_view in;
  bool ok = true;
  bool take(void* p, size_t n) {
    if (!ok || in.size() < n) return ok = false;
    std::memcpy(p, in.data(), n);
    in.remove_prefix(n);
    return true;
  }
  uint32_t u32() {
    uint32_t v = 0;
    take(&v, sizeof v);
    return v;
  }
  uint64_t u64() {
    uint64_t v = 0;
    take(&v, sizeof v);
    return v;
  }
  std::string_view str() {
    uint64_t n = u64();
    if (!ok || in.size() < n) {
      ok = false;
      return {};
    }
    std::string_view s = in.substr(0, n);
    in.remove_prefix(n);
    return s;
  }
};

void write_params(Writer& w, const std::vector<Param>& params) {
  w.u32(static_cast<uint32_t>(params.size()));
  for (const Param& p : params) {
    w.u32(static_cast<uint32_t>(p.dtype));
    w.u32(static_cast<uint32_t>(p.shape.size()));
    for (int64_t d : p.shape) w.u64(static_cast<uint64_t>(d));
    w.u32(static_cast<uint32_t>(p.dyn_src.size()));
    for (const DimFormula& f : p.dyn_src) {
      w.u32(static_cast<uint32_t>(f.terms.size()));
      for (auto [input, dim] : f.terms) {
        w.u32(static_cast<uint32_t>(input));
        w.u32(static_cast<uint32_t>(dim));
      }
      w.u64(static_cast<uint64_t>(f.constant));
    }
    w.u32(static_cast<uint32_t>(p.alias_input + 1));
  }
}

std::vector<Param> read_params(Reader& r) {
  std::vector<Param> params(r.ok ? std::min<uint32_t>(r.u32(), 1u << 16) : 0);
  for (Param& p : params) {
    p.dtype = static_cast<DType>(r.u32());
    p.shape.resize(std::min<uint32_t>(r.u32(), 64));
    for (int64_t& d : p.shape) d = static_cast<int64_t>(r.u64());
    p.dyn_src.resize(std::min<uint32_t>(r.u32(), 64));
    for (DimFormula& f : p.dyn_src) {
      f.terms.resize(std::min<uint32_t>(r.u32(), 64));
      for (auto& [input, dim] : f.terms) {
        input = static_cast<int>(r.u32());
        dim = static_cast<int>(r.u32());
      }
      f.constant = static_cast<int64_t>(r.u64());
    }
    p.alias_input = static_cast<int>(r.u32()) - 1;
  }
  return params;
}

std::string serialize(const std::string& key, const CompiledMeta& meta, const std::string& object) {
  Writer payload;
  payload.str(version());
  payload.str(key);
  write_params(payload, meta.inputs);
  write_params(payload, meta.outputs);
  payload.u32(static_cast<uint32_t>(meta.kernels));
  payload.str(meta.linalg);
  payload.u32(meta.row_split.splittable);
  payload.u32(static_cast<uint32_t>(meta.row_split.sliced_input.size()));
  for (bool sliced : meta.row_split.sliced_input) payload.u32(sliced);
  payload.u32(meta.row_split.gemm);
  payload.u32(meta.row_split.per_row);
  payload.str(meta.ptx);
  payload.u32(static_cast<uint32_t>(meta.gpu_kernels));
  payload.u32(static_cast<uint32_t>(meta.cuda_device));
  payload.u32(static_cast<uint32_t>(meta.profiled_kernels.size()));
  for (const std::string& k : meta.profiled_kernels) payload.str(k);
  payload.u32(static_cast<uint32_t>(meta.gpu_kernel_ops.size()));
  for (const auto& [kernel, ops] : meta.gpu_kernel_ops) {
    payload.str(kernel);
    payload.str(ops);
  }
  payload.str(object);
  Writer w;
  w.raw(kMagic, sizeof kMagic);
  w.u32(kFormat);
  w.u32(0);
  w.u64(payload.out.size());
  w.u64(llvm::xxh3_64bits(payload.out));
  return w.out + payload.out;
}

struct Entry {
  CompiledMeta meta;
  std::string object;
};

/// Parses an entry for `key`; on failure returns why and leaves `entry` unspecified.
std::string deserialize(std::string_view bytes, const std::string& key, Entry& entry) {
  Reader r{bytes};
  char magic[8];
  r.take(magic, sizeof magic);
  uint32_t format = r.u32();
  r.u32();
  uint64_t size = r.u64(), checksum = r.u64();
  if (!r.ok) return "corrupted entry (truncated header)";
  if (std::memcmp(magic, kMagic, sizeof magic) != 0) return "corrupted entry (magic)";
  if (format != kFormat) return "stale entry (format)";
  if (size != r.in.size()) return "corrupted entry (size)";
  if (llvm::xxh3_64bits(r.in) != checksum) return "corrupted entry (checksum)";
  if (r.str() != version()) return "stale entry (version)";
  if (r.str() != key) return "stale entry (key)";  // a hash collision, in practice never
  entry.meta.inputs = read_params(r);
  entry.meta.outputs = read_params(r);
  entry.meta.kernels = static_cast<int>(r.u32());
  entry.meta.linalg = std::string(r.str());
  entry.meta.row_split.splittable = r.u32() != 0;
  entry.meta.row_split.sliced_input.resize(std::min<uint32_t>(r.u32(), 1u << 16));
  for (size_t i = 0; i < entry.meta.row_split.sliced_input.size(); ++i)
    entry.meta.row_split.sliced_input[i] = r.u32() != 0;
  entry.meta.row_split.gemm = r.u32() != 0;
  entry.meta.row_split.per_row = r.u32() != 0;
  entry.meta.ptx = std::string(r.str());
  entry.meta.gpu_kernels = static_cast<int>(r.u32());
  entry.meta.cuda_device = static_cast<int>(r.u32());
  entry.meta.profiled_kernels.resize(std::min<uint32_t>(r.u32(), 1u << 16));
  for (std::string& k : entry.meta.profiled_kernels) k = std::string(r.str());
  entry.meta.gpu_kernel_ops.resize(std::min<uint32_t>(r.u32(), 1u << 16));
  for (auto& [kernel, ops] : entry.meta.gpu_kernel_ops) {
    kernel = std::string(r.str());
    ops = std::string(r.str());
  }
  entry.object = std::string(r.str());
  if (!r.ok || !r.in.empty()) return "corrupted entry (malformed)";
  for (const Param& out : entry.meta.outputs) {  // an output computed in an input's buffer
    if (out.alias_input < 0) continue;
    if (static_cast<size_t>(out.alias_input) >= entry.meta.inputs.size())
      return "corrupted entry (in-place input)";
    const Param& in = entry.meta.inputs[static_cast<size_t>(out.alias_input)];
    if (in.dtype != out.dtype || in.shape != out.shape) return "corrupted entry (in-place input)";
  }
  return "";
}

/// Entries larger than this are not read (a whole training step's object is a few MiB).
constexpr off_t kMaxEntryBytes = off_t{1} << 30;

/// Reads the entry at `path` whole, if it is a regular file (not a symlink) of at most
/// kMaxEntryBytes. Anything else is a miss, which the new entry then replaces: a FIFO there hung
/// the process in open(), a link to /dev/zero read until memory ran out (found by review).
bool read_file(const std::string& path, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= kMaxEntryBytes;
  if (ok) {
    out.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (ok && done < out.size()) {
      const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return ok;
}

/// Prints `message` once per directory and kind of failure: one flag for all of them hid a
/// later, different failure.
void warn_once(const std::string& dir, const char* kind, const std::string& message) {
  {
    std::lock_guard lock(g_mutex);
    if (!g_warned.insert(dir + "\n" + kind).second) return;
  }
  std::fprintf(stderr, "kiln: warning: %s\n", message.c_str());
}

bool unwritable(const std::string& dir) {
  std::lock_guard lock(g_mutex);
  return g_unwritable_dirs.count(dir) != 0;
}

/// The disk cache directory for these options, or "" (with the reason in `note`) when off.
std::string cache_dir(const CompileOptions& options, std::string& note) {
  std::string dir;
  if (!options.disk_cache) {
    note = "disabled (CompileOptions)";
  } else if (env_flag("KILN_DISABLE_CACHE")) {
    note = "disabled (KILN_DISABLE_CACHE)";
  } else if (!options.cache_dir.empty()) {
    dir = options.cache_dir;
  } else if (const char* env = std::getenv("KILN_CACHE_DIR")) {
    dir = env;
    if (dir.empty()) note = "disabled (KILN_CACHE_DIR is empty)";
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    dir = std::string(xdg) + "/kiln";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    dir = std::string(home) + "/.cache/kiln";
  } else {
    note = "disabled (no HOME)";
  }
  return dir;
}

/// The disk cache's default size limit (KILN_CACHE_MAX_SIZE). Entries average tens of KiB (a
/// whole training step's a few MiB), so this holds tens of thousands of graphs.
constexpr int64_t kDefaultMaxBytes = int64_t{1} << 30;

/// Bytes this process wrote into each directory since it last tidied it (guarded by g_mutex).
std::unordered_map<std::string, int64_t> g_written_since_tidy;

/// Whether a process's first write into `dir` should tidy it: when no process did in the last
/// ten minutes, by the mtime of `dir`/last-tidy, which this touches. A scan stats every entry
/// (21 ms for 11,000 entries here), too much for each short-lived process.
bool tidy_due(const std::string& dir) {
  const std::string marker = dir + "/last-tidy";
  struct stat st;
  if (::lstat(marker.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    // A marker dated in the future (a clock set back, another machine's clock) is not recent.
    const auto age =
        std::chrono::system_clock::now() - std::chrono::system_clock::from_time_t(st.st_mtime);
    if (age >= age.zero() && age < std::chrono::minutes(10)) return false;
  }
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                        0644);
  if (fd >= 0) {
    ::futimens(fd, nullptr);
    ::close(fd);
  }
  return true;
}

/// Keeps `dir` under its size limit and removes what killed writers left. Runs at the first
/// write of the process into `dir` (unless another process did in the last ten minutes:
/// tidy_due), then after each limit / 16 bytes it wrote there, so a directory shared by many
/// processes stays near its limit without a scan per write.
/// - Temporary files over an hour old are removed: a process killed between write and rename
///   left them, and nothing else would (a live writer's file is seconds old).
/// - When the entries (`*.kobj`) total more than the limit, the least recently used ones (oldest
///   modification time: a disk hit touches its entry) are removed until they total at most 80 %
///   of it, as ccache does, so that the next writes do not trim again. `keep`, the entry just
///   written, stays. An entry another process is reading stays readable until it closes it.
void tidy_directory(const std::string& dir, const std::string& keep, size_t written) {
  const int64_t limit = env_bytes("KILN_CACHE_MAX_SIZE", kDefaultMaxBytes);
  bool first = false;
  {
    std::lock_guard lock(g_mutex);
    auto [it, inserted] = g_written_since_tidy.try_emplace(dir, 0);
    first = inserted;
    it->second += static_cast<int64_t>(written);
    if (!first && (limit == 0 || it->second < limit / 16)) return;
    it->second = 0;
  }
  if (first && !tidy_due(dir)) return;
  struct Found {
    int64_t used_ns;
    int64_t bytes;
    std::string name;
  };
  std::vector<Found> entries;
  int64_t total = 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  const int dir_fd = ::dirfd(d);
  const int64_t stale_ns = (static_cast<int64_t>(::time(nullptr)) - 3600) * 1'000'000'000;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    const bool temporary = name.find(".kobj.tmp.") != std::string_view::npos;
    if (!temporary && !(name.size() > 5 && name.ends_with(".kobj"))) continue;
    struct stat st;  // one stat per entry: its mtime and size
    if (::fstatat(dir_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    const int64_t used_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
    if (temporary) {
      if (used_ns < stale_ns) ::unlinkat(dir_fd, e->d_name, 0);
      continue;
    }
    entries.push_back({used_ns, static_cast<int64_t>(st.st_size), std::string(name)});
    total += st.st_size;
  }
  if (limit > 0 && total > limit) {
    std::sort(entries.begin(), entries.end(),
              [](const Found& a, const Found& b) { return a.used_ns < b.used_ns; });
    const std::string keep_name = fs::path(keep).filename().string();
    const int64_t target = limit / 5 * 4;
    for (const Found& f : entries) {
      if (total <= target) break;
      if (f.name != keep_name && ::unlinkat(dir_fd, f.name.c_str(), 0) == 0) total -= f.bytes;
    }
  }
  ::closedir(d);
}

/// Writes `bytes` to `path` atomically (temp file + rename): readers see all of it or nothing.
/// A failure to write into `dir` stops later writes there, not reads: a read-only cache filled
/// beforehand, or one that was full for a moment, still serves the entries it has.
void write_entry(const std::string& dir, const std::string& path, const std::string& bytes,
                 std::string& note) {
  // Writing past the file size limit (ulimit -f) raises SIGXFSZ, which kills the process and
  // left the temporary file. The signal comes only from a write that would cross the limit, so
  // an entry that fits is written whole; a larger one is skipped.
  if (rlimit limit{}; ::getrlimit(RLIMIT_FSIZE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
                      bytes.size() > limit.rlim_cur) {
    note = "not written (over the file size limit)";
    warn_once(dir, "file size",
              fmt::format("not writing compile cache entries over the file size limit (ulimit "
                          "-f) of {} bytes in '{}' ('{}' has {} bytes)",
                          static_cast<uint64_t>(limit.rlim_cur), dir, path, bytes.size()));
    return;
  }
  static std::atomic<unsigned> counter{0};
  std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string error = ec ? ec.message() : "";
  if (error.empty()) {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    bool ok = f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    if (f && std::fclose(f) != 0) ok = false;
    if (ok) fs::rename(tmp, path, ec);
    if (!ok || ec) {
      error = ok ? ec.message() : std::strerror(errno);
      fs::remove(tmp, ec);
    }
    if (ok && error.empty()) tidy_directory(dir, path, bytes.size());
    if (ok && !error.empty()) {
      // The directory took the new file; only this entry's name is taken (a directory, or
      // another user's file in a sticky directory): the cache stays on for other entries.
      note = "not written (" + error + ")";
      warn_once(dir, "entry",
                "cannot replace the compile cache entry '" + path + "' (" + error + ")");
      return;
    }
  }
  if (error.empty()) return;
  note = "not written (unwritable cache dir: " + error + ")";
  {
    std::lock_guard lock(g_mutex);
    g_unwritable_dirs.insert(dir);
  }
  warn_once(dir, "dir",
            "cannot write the compile cache in '" + dir + "' (" + error +
                "); its entries are still read, new ones are not written");
}

const char* source_name(CompileStats::Source s) {
  switch (s) {
    case CompileStats::Source::MemoryCache:
      return "memory cache hit";
    case CompileStats::Source::DiskCache:
      return "disk cache hit";
    default:
      return "compiled";
  }
}

}  // namespace

void clear_memory_cache() {
  std::lock_guard lock(g_mutex);
  g_memory.clear();
}

void set_codegen_version_for_testing(const std::string& v) {
  std::lock_guard lock(g_mutex);
  g_version_override = v;
}

std::shared_ptr<const CompiledCode> get_or_compile(const std::string& graph_mlir,
                                                   const CompileOptions& options,
                                                   CompileStats& stats, const CompileFn& compile) {
  Lap total, lap;
  init_llvm();
  // Environment switches that change the generated code are part of the key.
  const bool loops_for_gemm = env_flag("KILN_NO_EXTERN_GEMM");
  const GpuLoopEmulation emulation = gpu_loop_emulation(options);
  const char* emulated = emulation == GpuLoopEmulation::Off       ? ""
                         : emulation == GpuLoopEmulation::InOrder ? " emulating gpu loops"
                                                                  : " emulating gpu loops in reverse";
  const std::string gpu_target =
      options.device.is_cuda() || emulation != GpuLoopEmulation::Off
          ? fmt::format("\n{}{} {} {} O{} {} x{} lanes {} toolkit {}", options.device.str(),
                        emulated, options.gpu.chip, options.gpu.features, options.gpu.opt_level,
                        options.gpu.threads_per_block, options.gpu.elements_per_thread,
                        options.gpu.row_lanes, options.gpu.toolkit)
          : "";
  std::string in_place;
  for (auto [output, input] : options.in_place_outputs)
    in_place += fmt::format(" {}:{}", output, input);
  const std::string key = host_target_id() + gpu_target +
                          (loops_for_gemm ? "\nno-extern-gemm" : "") +
                          (kernel_profiling(options) ? "\nkernel timers" : "") +
                          (in_place.empty() ? "" : "\nin-place outputs" + in_place) + "\n" +
                          graph_mlir;
  const std::string memory_key = version() + "\n" + key;
  std::shared_ptr<const CompiledCode> code;
  if (options.memory_cache) {
    std::lock_guard lock(g_mutex);
    auto it = g_memory.find(memory_key);
    if (it != g_memory.end()) code = it->second.lock();
  }
  std::string dir, path;
  if (!code) {
    dir = cache_dir(options, stats.disk_note);
    if (!dir.empty()) {
      // With the version: two builds sharing the directory deleted each other's entries as
      // stale, so neither hit; old versions' entries age out under KILN_CACHE_MAX_SIZE.
      llvm::XXH128_hash_t h = llvm::xxh3_128bits(llvm::arrayRefFromStringRef(memory_key));
      char name[40];
      std::snprintf(name, sizeof name, "%016llx%016llx.kobj",
                    static_cast<unsigned long long>(h.high64),
                    static_cast<unsigned long long>(h.low64));
      path = dir + "/" + name;
    }
  }
  stats.key_ms = lap();
  if (code) {
    stats.source = CompileStats::Source::MemoryCache;
    stats.object_bytes = code->object_bytes;
    stats.object_parts = code->object_parts;
  } else if (std::string bytes; !path.empty() && read_file(path, bytes)) {
    Entry entry;
    std::string why = deserialize(bytes, key, entry);
    stats.disk_ms = lap();
    if (why.empty()) {
      try {
        code = load_object(entry.object, std::move(entry.meta), stats);
        stats.source = CompileStats::Source::DiskCache;
        // Marks the entry used, for tidy_directory's least-recently-used order (atimes are
        // often not kept: noatime, relatime). Fails harmlessly on another user's entry.
        ::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
      } catch (const Error& e) {
        why = std::string("unloadable entry: ") + e.what();
      }
    }
    if (!why.empty()) {
      stats.disk_note = why;
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
  if (!code) {
    CompiledMeta meta;
    std::string object = compile(meta);
    const bool write = !path.empty() && !unwritable(dir);
    std::string bytes = write ? serialize(key, meta, object) : "";
    code = load_object(object, std::move(meta), stats);
    if (!path.empty() && !write) {
      stats.disk_note = "not written (unwritable cache dir)";  // a write there failed before
    } else if (write) {
      lap();
      write_entry(dir, path, bytes, stats.disk_note);
      stats.disk_ms = lap();
    }
  }
  if (options.memory_cache && stats.source != CompileStats::Source::MemoryCache) {
    std::lock_guard lock(g_mutex);
    g_memory.insert_or_assign(memory_key, code);
    if (g_memory.size() >= g_memory_sweep_at) {
      std::erase_if(g_memory, [](const auto& e) { return e.second.expired(); });
      g_memory_sweep_at = std::max<std::size_t>(64, 2 * g_memory.size());
    }
  }
  stats.total_ms = total();
  if (log_enabled(kLogCodegen)) {
    char ms[32];
    std::snprintf(ms, sizeof ms, ", %.2f ms", stats.total_ms);
    log_text("object", std::to_string(code->object_bytes) + " bytes, " + source_name(stats.source) +
                           (stats.disk_note.empty() ? "" : ", disk cache: " + stats.disk_note) +
                           ms);
  }
  return code;
}

}  // namespace kiln::codegen
