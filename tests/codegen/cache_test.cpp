// codegen's compile cache: in-memory and on-disk hits, bad entries rebuilt, no collisions,
// KILN_LOGS dumps. Results are compared with eager kiln.
#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <fcntl.h>
#include <grp.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "codegen/cache.h"
#include "codegen/codegen.h"
#include "address_limit.h"
#include "codegen/jit.h"
#include "kiln/kiln.h"

using namespace kiln;
namespace fs = std::filesystem;
using Source = codegen::CompileStats::Source;

namespace {

/// Sets an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string make_temp_dir() {
  char tmpl[] = "/tmp/kiln-cache-test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  return tmpl;
}

/// A fresh KILN_CACHE_DIR (removed afterwards) and an empty memory cache.
struct TempCache {
  std::string dir = make_temp_dir();
  ScopedEnv env{"KILN_CACHE_DIR", dir.c_str()};
  ScopedEnv enabled{"KILN_DISABLE_CACHE", nullptr};
  TempCache() { codegen::clear_memory_cache(); }
  ~TempCache() {
    codegen::clear_memory_cache();
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::vector<fs::path> entries() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename() != "last-tidy") out.push_back(e.path());  // tidying's marker
    return out;
  }
};

/// 10 elementwise ops: sigmoid(max(|-(((tanh(x*y + x) - y) * x)|, y)) + x.
ir::Graph chain(const std::vector<int64_t>& shape, DType dtype = DType::Float32) {
  ir::Graph g;
  ir::Value x = g.input(dtype, shape), y = g.input(dtype, shape);
  ir::Value v = g.op(OpKind::Tanh, {g.op(OpKind::Add, {g.op(OpKind::Mul, {x, y}), x})});
  v = g.op(OpKind::Neg, {g.op(OpKind::Mul, {g.op(OpKind::Sub, {v, y}), x})});
  v = g.op(OpKind::Sigmoid, {g.op(OpKind::Maximum, {g.op(OpKind::Abs, {v}), y})});
  g.output(g.op(OpKind::Add, {v, x}));
  return g;
}

Tensor eager_chain(const Tensor& x, const Tensor& y) {
  Tensor v = neg(mul(sub(tanh(add(mul(x, y), x)), y), x));
  return add(sigmoid(maximum(abs(v), y)), x);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  REQUIRE(a.dtype() == b.dtype());
  return amax(abs(sub(a, b))).item<double>();
}

/// Runs `exe` on random inputs of `shape` and checks it against eager (tanh/exp are polynomial
/// approximations in compiled code).
void check_chain(const codegen::Executable& exe, const Shape& shape,
                 DType dtype = DType::Float32) {
  Tensor x = randn(shape).to(dtype), y = randn(shape).to(dtype);
  std::vector<Tensor> out = exe.run({x, y});
  REQUIRE(out.size() == 1);
  CHECK(max_abs_diff(out[0], eager_chain(x, y)) < 1e-5);
}

codegen::Executable compile_fresh(const ir::Graph& g) {
  codegen::clear_memory_cache();
  return codegen::Executable(g);
}

}  // namespace

TEST_CASE("cache: a memory hit shares the code and does not recompile") {
  TempCache cache;
  ir::Graph g = chain({64, 33});
  codegen::Executable a(g);
  CHECK(a.stats().source == Source::Compiled);
  CHECK(a.stats().llvm_opt_ms > 0);
  codegen::Executable b(chain({64, 33}));  // an equal graph built again
  CHECK(b.stats().source == Source::MemoryCache);
  CHECK(b.stats().lower_ms == 0);
  CHECK(b.stats().llvm_opt_ms == 0);
  CHECK(b.stats().object_bytes == a.stats().object_bytes);
  CHECK(b.num_kernels() == a.num_kernels());
  CHECK(b.linalg_ir() == a.linalg_ir());
  Tensor x = randn({64, 33}), y = randn({64, 33});
  CHECK(max_abs_diff(a.run({x, y})[0], b.run({x, y})[0]) == 0);
  check_chain(b, {64, 33});
  // Without the memory cache it compiles again.
  codegen::CompileOptions no_memory;
  no_memory.memory_cache = false;
  no_memory.disk_cache = false;
  CHECK(codegen::Executable(g, no_memory).stats().source == Source::Compiled);
}

TEST_CASE("cache: a disk hit after the memory cache is cleared; dynamic dims survive") {
  TempCache cache;
  ir::Graph g = chain({ir::kDynamic, 7});
  codegen::Executable a = compile_fresh(g);
  CHECK(a.stats().source == Source::Compiled);
  REQUIRE(cache.entries().size() == 1);
  CHECK(cache.entries()[0].extension() == ".kobj");
  codegen::Executable b = compile_fresh(g);
  CHECK(b.stats().source == Source::DiskCache);
  CHECK(b.stats().disk_note.empty());
  CHECK(b.stats().lower_ms == 0);
  CHECK(b.stats().object_bytes == a.stats().object_bytes);
  CHECK(b.num_kernels() == 1);
  CHECK(b.linalg_ir() == a.linalg_ir());
  check_chain(b, {5, 7});
  check_chain(b, {130, 7});
  CHECK_THROWS_AS(b.run({randn({5, 6}), randn({5, 6})}), Error);  // static dim still checked
}

TEST_CASE("cache: a disk hit keeps the row-split plan (threads over rows)") {
  TempCache cache;
  ir::Graph g = chain({512, 256});  // 1.5 MB of rows: run() splits them over the pool
  codegen::Executable a = compile_fresh(g);
  codegen::Executable b = compile_fresh(g);
  REQUIRE(b.stats().source == Source::DiskCache);
  CHECK(a.row_parallel());
  CHECK(b.row_parallel());
  check_chain(b, {512, 256});
  CHECK_THROWS_AS(b.run({randn({511, 256}), randn({511, 256})}), Error);  // dim 0 still static
}

TEST_CASE("cache: corrupted or truncated entries are deleted and rebuilt") {
  TempCache cache;
  ir::Graph g = chain({100});
  compile_fresh(g);
  REQUIRE(cache.entries().size() == 1);
  const fs::path entry = cache.entries()[0];
  const auto size = fs::file_size(entry);
  // (what to do to the file, the expected note)
  std::vector<std::pair<std::function<void()>, std::string>> damages = {
      {[&] { fs::resize_file(entry, size / 2); }, "corrupted entry (size)"},
      {[&] { fs::resize_file(entry, 10); }, "corrupted entry (truncated header)"},
      {[&] { fs::resize_file(entry, 0); }, "corrupted entry (truncated header)"},
      {[&] {
         std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(static_cast<std::streamoff>(size - 100));
         f.put('\x5a').put('\xa5');
       },
       "corrupted entry (checksum)"},
      {[&] {
         std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
         f.put('X');
       },
       "corrupted entry (magic)"},
  };
  for (auto& [damage, note] : damages) {
    INFO(note);
    damage();
    codegen::Executable rebuilt = compile_fresh(g);
    CHECK(rebuilt.stats().source == Source::Compiled);
    CHECK(rebuilt.stats().disk_note == note);
    check_chain(rebuilt, {100});
    codegen::Executable again = compile_fresh(g);  // the rewritten entry is good
    CHECK(again.stats().source == Source::DiskCache);
    check_chain(again, {100});
    REQUIRE(fs::file_size(entry) == size);
  }
}

// An entry path holding something other than a regular file is a miss, replaced by the new
// entry: a FIFO there hung open(), a link to /dev/zero was read until memory ran out. A name
// that cannot be replaced (a directory) skips that entry only: it turned the cache off for
// the whole directory, with a warning that the directory was unwritable.
TEST_CASE("cache: a FIFO, a link or a directory at an entry's path is not read") {
  TempCache cache;
  ir::Graph g = chain({100});
  compile_fresh(g);
  REQUIRE(cache.entries().size() == 1);
  const fs::path entry = cache.entries()[0];
  SECTION("a FIFO, then a symlink to /dev/zero: replaced by the entry") {
    for (int kind = 0; kind < 2; ++kind) {
      INFO((kind == 0 ? "FIFO" : "symlink"));
      fs::remove(entry);
      if (kind == 0)
        REQUIRE(::mkfifo(entry.c_str(), 0600) == 0);
      else
        fs::create_symlink("/dev/zero", entry);
      codegen::Executable rebuilt = compile_fresh(g);
      CHECK(rebuilt.stats().source == Source::Compiled);
      check_chain(rebuilt, {100});
      CHECK(fs::is_regular_file(fs::symlink_status(entry)));
      CHECK(compile_fresh(g).stats().source == Source::DiskCache);
    }
  }
  SECTION("a directory: this entry is not written, the others are") {
    fs::remove(entry);
    fs::create_directory(entry);
    codegen::Executable a = compile_fresh(g);
    CHECK(a.stats().source == Source::Compiled);
    CHECK(a.stats().disk_note.rfind("not written (", 0) == 0);
    check_chain(a, {100});
    ir::Graph other = chain({7});
    compile_fresh(other);
    CHECK(compile_fresh(other).stats().source == Source::DiskCache);
    CHECK(fs::is_directory(entry));
  }
}

// A writer killed between write and rename left its temporary file for good; the first write
// into a directory now removes those over an hour old (a live writer's is seconds old).
TEST_CASE("cache: temporary files of writers that did not finish are removed after an hour") {
  TempCache cache;
  const fs::path stale = fs::path(cache.dir) / "0123456789abcdef0123456789abcdef.kobj.tmp.1.0";
  const fs::path fresh = fs::path(cache.dir) / "0123456789abcdef0123456789abcdef.kobj.tmp.2.0";
  std::ofstream(stale) << "partial";
  std::ofstream(fresh) << "partial";
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(2));
  const fs::path marker = fs::path(cache.dir) / "last-tidy";
  SECTION("by the first write of a process") {
    compile_fresh(chain({5}));
    CHECK_FALSE(fs::exists(stale));
    CHECK(fs::exists(fresh));
    CHECK(fs::exists(marker));
  }
  SECTION("unless another process tidied the directory in the last ten minutes") {
    std::ofstream(marker).flush();
    compile_fresh(chain({5}));
    CHECK(fs::exists(stale));
  }
  SECTION("or when the marker is dated in the future (a clock set back)") {
    std::ofstream(marker).flush();
    fs::last_write_time(marker, fs::file_time_type::clock::now() + std::chrono::hours(24));
    compile_fresh(chain({5}));
    CHECK_FALSE(fs::exists(stale));
  }
  SECTION("when the other process tidied it over ten minutes ago") {
    std::ofstream(marker).flush();
    fs::last_write_time(marker, fs::file_time_type::clock::now() - std::chrono::minutes(11));
    compile_fresh(chain({5}));
    CHECK_FALSE(fs::exists(stale));
  }
}

/// The .kobj entries in `dir` and their total size.
static std::pair<std::vector<fs::path>, std::uintmax_t> kobj_entries(const std::string& dir) {
  std::pair<std::vector<fs::path>, std::uintmax_t> out{{}, 0};
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".kobj") continue;
    out.first.push_back(e.path());
    out.second += e.file_size();
  }
  return out;
}

TEST_CASE("cache: over KILN_CACHE_MAX_SIZE the least recently used entries are removed") {
  TempCache cache;
  const auto now = fs::file_time_type::clock::now();
  // Graph a's entry, then ten other entries as large, last used 10 to 1 hours ago, and a file
  // that is not an entry.
  compile_fresh(chain({5}));
  REQUIRE(cache.entries().size() == 1);
  const fs::path a = cache.entries()[0];
  const std::uintmax_t size = fs::file_size(a);
  std::vector<fs::path> others;
  for (int i = 0; i < 10; ++i) {
    others.push_back(fs::path(cache.dir) / fmt::format("{:032x}.kobj", i));
    std::ofstream(others.back()) << std::string(size, 'x');
    fs::last_write_time(others.back(), now - std::chrono::hours(10 - i));
  }
  const fs::path notes = fs::path(cache.dir) / "notes.txt";
  std::ofstream(notes) << std::string(20 * size, 'n');
  const std::string limit = std::to_string(6 * size);  // the limit / 16 < one entry's size

  SECTION("a disk hit marks its entry used; a write past the limit trims to 80 % of it") {
    fs::last_write_time(a, now - std::chrono::hours(20));  // the oldest, unless the hit marks it
    CHECK(compile_fresh(chain({5})).stats().source == Source::DiskCache);
    ScopedEnv max_size("KILN_CACHE_MAX_SIZE", limit.c_str());
    compile_fresh(chain({7}));  // a second entry, written past the limit
    const auto [left, total] = kobj_entries(cache.dir);
    CHECK(total <= 6 * size / 5 * 4);
    CHECK(fs::exists(a));
    CHECK(fs::exists(notes));
    CHECK_FALSE(fs::exists(others.front()));
    // What is left of the others are the most recently used ones.
    int kept = 0;
    for (size_t i = 0; i < others.size(); ++i) {
      INFO(i);
      if (fs::exists(others[i])) ++kept;
      else CHECK(kept == 0);
    }
    CHECK(left.size() == static_cast<size_t>(kept) + 2);
    CHECK(kept >= 1);
  }
  SECTION("KILN_CACHE_MAX_SIZE=0: no limit") {
    ScopedEnv max_size("KILN_CACHE_MAX_SIZE", "0");
    compile_fresh(chain({7}));
    CHECK(kobj_entries(cache.dir).first.size() == 12);
  }
}

/// Sets the codegen version for one scope ("" is the real one), then restores the real one.
struct ScopedVersion {
  explicit ScopedVersion(const std::string& v) { codegen::set_codegen_version_for_testing(v); }
  ~ScopedVersion() { codegen::set_codegen_version_for_testing(""); }
};

// Two builds sharing a directory deleted each other's entries as stale ("stale entry
// (version)"), so neither ever hit. The version is now in the entry's name, as ccache does.
TEST_CASE("cache: builds of two codegen versions sharing a directory both hit") {
  TempCache cache;
  ir::Graph g = chain({3, 4});
  for (const char* v : {"kiln-codegen 0 (test)", ""}) {
    ScopedVersion version(v);
    codegen::Executable first = compile_fresh(g);
    CHECK(first.stats().source == Source::Compiled);
    CHECK(first.stats().disk_note.empty());
  }
  CHECK(cache.entries().size() == 2);  // one each
  for (int round = 0; round < 3; ++round) {
    for (const char* v : {"kiln-codegen 0 (test)", ""}) {
      INFO(round << " " << v);
      ScopedVersion version(v);
      codegen::Executable hit = compile_fresh(g);
      CHECK(hit.stats().source == Source::DiskCache);
      check_chain(hit, {3, 4});
    }
  }
  CHECK(cache.entries().size() == 2);
}

TEST_CASE("cache: an entry that holds another codegen version is stale and rebuilt") {
  TempCache cache;
  ir::Graph g = chain({3, 4});
  fs::path old_entry, entry;
  {
    ScopedVersion version("kiln-codegen 0 (test)");
    compile_fresh(g);
    REQUIRE(cache.entries().size() == 1);
    old_entry = cache.entries()[0];
  }
  compile_fresh(g);
  REQUIRE(cache.entries().size() == 2);
  entry = cache.entries()[cache.entries()[0] == old_entry ? 1 : 0];
  fs::copy_file(old_entry, entry, fs::copy_options::overwrite_existing);  // as if damaged
  codegen::Executable rebuilt = compile_fresh(g);
  CHECK(rebuilt.stats().source == Source::Compiled);
  CHECK(rebuilt.stats().disk_note == "stale entry (version)");
  check_chain(rebuilt, {3, 4});
  CHECK(cache.entries().size() == 2);  // replaced, not added
  CHECK(compile_fresh(g).stats().source == Source::DiskCache);
  ScopedVersion version("kiln-codegen 0 (test)");
  CHECK(compile_fresh(g).stats().source == Source::DiskCache);  // the old one is untouched
}

/// The names in `dir` that are writers' temporary files.
static std::vector<std::string> temporary_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos)
      out.push_back(e.path().filename().string());
  return out;
}

// Under `ulimit -f` an entry larger than the limit killed the process with SIGXFSZ in the
// middle of its write, leaving the temporary file. The signal comes only from a write crossing
// the limit, so an entry of exactly the limit is written and a larger one skipped.
TEST_CASE("cache: an entry over the file size limit (ulimit -f) is not written, no SIGXFSZ") {
  TempCache cache;
  ir::Graph g = chain({100});
  compile_fresh(g);
  REQUIRE(cache.entries().size() == 1);
  const fs::path entry = cache.entries()[0];
  const auto size = static_cast<rlim_t>(fs::file_size(entry));
  for (rlim_t limit : {size - 1, size / 4, size}) {
    INFO("limit " << limit << ", entry " << size);
    fs::remove(entry);
    const int status = testing::status_of_child([&] {
      // Output to a file past the limit would raise SIGXFSZ too.
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      rlimit r{limit, limit};
      if (::setrlimit(RLIMIT_FSIZE, &r) != 0) return 10;
      codegen::Executable exe = compile_fresh(g);
      if (exe.stats().source != Source::Compiled) return 11;
      const bool fits = limit >= size;
      if (exe.stats().disk_note != (fits ? "" : "not written (over the file size limit)"))
        return 12;
      Tensor x = randn({100}), y = randn({100});
      return max_abs_diff(exe.run({x, y})[0], eager_chain(x, y)) < 1e-5 ? 0 : 13;
    });
    CHECK(WIFEXITED(status));
    CHECK_FALSE(WIFSIGNALED(status));  // SIGXFSZ
    if (WIFEXITED(status)) CHECK(WEXITSTATUS(status) == 0);
    CHECK(temporary_files(cache.dir).empty());
    CHECK(fs::exists(entry) == (limit >= size));
    if (fs::exists(entry)) CHECK(compile_fresh(g).stats().source == Source::DiskCache);
  }
}

// One failed write put the directory on a "do not use" list, so a read-only cache filled
// beforehand (or one full for a moment) served none of the entries it had.
TEST_CASE("cache: after a failed write the directory is still read, no longer written") {
  TempCache cache;
  ir::Graph g = chain({9}), other = chain({10}), third = chain({11});
  compile_fresh(g);
  REQUIRE(cache.entries().size() == 1);
  // Root ignores the permissions: it runs the checks as nobody in a child process instead.
  const bool root = ::geteuid() == 0;
  if (root) REQUIRE(::chown(cache.dir.c_str(), 65534, 65534) == 0);
  REQUIRE(::chmod(cache.dir.c_str(), 0555) == 0);
  const int status = testing::status_of_child([&] {
    if (root && (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
                 ::setresuid(65534, 65534, 65534) != 0))
      return 20;
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 2);  // the warning
    codegen::Executable hit = compile_fresh(g);
    if (hit.stats().source != Source::DiskCache) return 21;
    codegen::Executable failed = compile_fresh(other);  // the write fails: EACCES
    if (failed.stats().source != Source::Compiled) return 22;
    codegen::Executable still_hit = compile_fresh(g);
    if (still_hit.stats().source != Source::DiskCache) return 23;
    Tensor x = randn({9}), y = randn({9});
    if (max_abs_diff(still_hit.run({x, y})[0], eager_chain(x, y)) >= 1e-5) return 24;
    if (failed.stats().disk_note.rfind("not written (unwritable cache dir: ", 0) != 0) return 25;
    codegen::Executable not_tried = compile_fresh(third);
    if (not_tried.stats().disk_note != "not written (unwritable cache dir)") return 26;
    if (not_tried.stats().disk_ms != 0) return 27;
    return 0;
  });
  ::chmod(cache.dir.c_str(), 0755);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // otherwise the number of the check that failed
  CHECK(cache.entries().size() == 1);
}

TEST_CASE("cache: an unusable or disabled cache dir still compiles") {
  TempCache cache;
  ir::Graph g = chain({8});
  SECTION("unwritable (a path below a regular file)") {
    const std::string file = cache.dir + "/plain-file";
    std::ofstream(file) << "x";
    ScopedEnv env("KILN_CACHE_DIR", (file + "/kiln").c_str());
    codegen::Executable a = compile_fresh(g);
    CHECK(a.stats().source == Source::Compiled);
    CHECK(a.stats().disk_note == "not written (unwritable cache dir: Not a directory)");
    check_chain(a, {8});
    codegen::Executable b = compile_fresh(g);  // not written again
    CHECK(b.stats().source == Source::Compiled);
    CHECK(b.stats().disk_note == "not written (unwritable cache dir)");
    CHECK(b.stats().disk_ms == 0);
  }
  SECTION("KILN_CACHE_DIR empty") {
    ScopedEnv env("KILN_CACHE_DIR", "");
    codegen::Executable a = compile_fresh(g);
    CHECK(a.stats().disk_note == "disabled (KILN_CACHE_DIR is empty)");
    check_chain(a, {8});
    CHECK(cache.entries().empty());
  }
  SECTION("KILN_DISABLE_CACHE=1") {
    ScopedEnv env("KILN_DISABLE_CACHE", "1");
    codegen::Executable a = compile_fresh(g);
    CHECK(a.stats().disk_note == "disabled (KILN_DISABLE_CACHE)");
    CHECK(cache.entries().empty());
  }
  SECTION("CompileOptions::cache_dir overrides the environment") {
    const std::string dir = cache.dir + "/explicit";
    codegen::CompileOptions options;
    options.cache_dir = dir;
    codegen::clear_memory_cache();
    codegen::Executable a(g, options);
    CHECK(fs::exists(dir));
    CHECK(cache.entries().size() == 1);  // just the explicit dir
    codegen::clear_memory_cache();
    CHECK(codegen::Executable(g, options).stats().source == Source::DiskCache);
  }
}

TEST_CASE("cache: different shapes, dtypes and ops do not collide") {
  TempCache cache;
  ir::Graph other_op;
  {
    ir::Value x = other_op.input(DType::Float32, {3, 4}), y = other_op.input(DType::Float32, {3, 4});
    other_op.output(other_op.op(OpKind::Sub, {x, y}));
  }
  for (int pass = 0; pass < 2; ++pass) {  // compile, then every one from disk
    INFO("pass " << pass);
    codegen::clear_memory_cache();
    Source expected = pass == 0 ? Source::Compiled : Source::DiskCache;
    codegen::Executable a(chain({3, 4})), b(chain({4, 3})), c(chain({3, 4}, DType::Float64)),
        d(other_op);
    for (const codegen::Executable* e : {&a, &b, &c, &d}) CHECK(e->stats().source == expected);
    check_chain(a, {3, 4});
    check_chain(b, {4, 3});
    check_chain(c, {3, 4}, DType::Float64);
    CHECK_THROWS_AS(a.run({randn({4, 3}), randn({4, 3})}), Error);
    CHECK_THROWS_AS(c.run({randn({3, 4}), randn({3, 4})}), Error);  // float32 into float64
    Tensor x = randn({3, 4}), y = randn({3, 4});
    CHECK(max_abs_diff(d.run({x, y})[0], sub(x, y)) == 0);
  }
  CHECK(cache.entries().size() == 4);
}

TEST_CASE("cache: Executables sharing code run concurrently") {
  TempCache cache;
  codegen::Executable a(chain({257})), b(chain({257}));
  REQUIRE(b.stats().source == Source::MemoryCache);
  Tensor x = randn({257}), y = randn({257});
  Tensor expected = a.run({x, y})[0];
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const codegen::Executable& e = t % 2 ? a : b;
      for (int i = 0; i < 50; ++i)
        if (amax(abs(sub(e.run({x, y})[0], expected))).item<double>() != 0) ++bad[t];
    });
  for (std::thread& t : threads) t.join();
  CHECK(bad == std::vector<int>(4, 0));
}

TEST_CASE("cache: set_log_stages dumps every stage to stderr") {
  TempCache cache;
  const std::string log = cache.dir + "/stderr.txt";
  std::fflush(stderr);
  int saved = ::dup(2);
  FILE* f = std::fopen(log.c_str(), "w");
  REQUIRE(f);
  ::dup2(::fileno(f), 2);
  codegen::set_log_stages("ir, codegen");
  {
    codegen::Executable a(chain({16}));
    codegen::Executable b(chain({16}));  // a memory hit logs its outcome only
  }
  codegen::set_log_stages("");
  codegen::Executable quiet(chain({12345}));
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::fclose(f);
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* stage : {"kiln MLIR", "linalg fused", "bufferized", "LLVM dialect",
                            "LLVM IR after -O2"}) {
    INFO(stage);
    CHECK(text.find(std::string("kiln codegen: ") + stage + " -----") != std::string::npos);
  }
  CHECK(text.find("kiln.elementwise") != std::string::npos);
  CHECK(text.find("linalg.generic") != std::string::npos);
  CHECK(text.find("llvm.func") != std::string::npos);
  CHECK(text.find("define void @_mlir__mlir_ciface_main") != std::string::npos);
  CHECK(text.find("bytes, compiled") != std::string::npos);
  CHECK(text.find("bytes, memory cache hit") != std::string::npos);
  CHECK(text.find("12345xf32") == std::string::npos);  // nothing logged once switched off
}

TEST_CASE("cache: Executables are built concurrently (same and different graphs)") {
  TempCache cache;
  // Inputs and expected values made here: Catch2 assertions and the RNG stay on this thread.
  std::vector<std::vector<Tensor>> inputs = {{randn({40}), randn({40})}, {randn({41}), randn({41})}};
  std::vector<Tensor> expected;
  for (const auto& in : inputs) expected.push_back(eager_chain(in[0], in[1]));
  std::vector<int> bad(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 3; ++i) {
          const int k = t % 2;  // two threads per graph
          codegen::Executable e(chain({40 + k}));
          Tensor diff = abs(sub(e.run(inputs[k])[0], expected[k]));
          if (amax(diff).item<double>() >= 1e-5) ++bad[t];
          if (i == 1) codegen::clear_memory_cache();
        }
      } catch (const std::exception&) {
        ++bad[t];
      }
    });
  for (std::thread& t : threads) t.join();
  CHECK(bad == std::vector<int>(4, 0));
  CHECK(cache.entries().size() == 2);
}

namespace {

/// `n` rounds of v = tanh(v + mean(v)) on a small x: each round is two serial loop nests (the
/// mean, read with broadcasting, is not fused into the add), so the module is large.
ir::Graph rounds(int n, const std::vector<int64_t>& shape) {
  ir::Graph g;
  ir::Value v = g.input(DType::Float32, shape);
  for (int i = 0; i < n; ++i)
    v = g.op(OpKind::Tanh, {g.op(OpKind::Add, {v, g.op(OpKind::Mean, {v})})});
  g.output(v);
  return g;
}

Tensor eager_rounds(int n, Tensor v) {
  for (int i = 0; i < n; ++i) v = tanh(add(v, mean(v)));
  return v;
}

}  // namespace

TEST_CASE("cache: a large graph is emitted in parts on several threads, cached as one bundle") {
  TempCache cache;
  const int n = 150;
  ir::Graph g = rounds(n, {32, 16});
  codegen::Executable a = compile_fresh(g);
  CHECK(a.stats().source == Source::Compiled);
  INFO("kernels " << a.num_kernels());
  CHECK(a.num_kernels() >= 2 * n);
  // Parts only where there are threads to run them (CI and development machines have 2).
  if (std::thread::hardware_concurrency() >= 2) CHECK(a.stats().object_parts > 1);
  else CHECK(a.stats().object_parts == 1);
  Tensor x = randn({32, 16});
  Tensor want = eager_rounds(n, x);
  CHECK(max_abs_diff(a.run({x})[0], want) < 1e-5);
  // A part reaches the others' symbols through its own GOT entries and stubs, never with a
  // 32-bit direct address: the JIT may load parts more than 2 GiB apart (it did under ASan).
  REQUIRE(cache.entries().size() == 1);
  std::ifstream in(cache.entries()[0], std::ios::binary);
  const std::string entry((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t bundle_at = entry.find("KILNOBJS");  // the object bundle ends the entry
  REQUIRE(bundle_at != std::string::npos);
  const std::vector<std::string_view> parts =
      codegen::unbundle_objects(std::string_view(entry).substr(bundle_at));
  CHECK(static_cast<int>(parts.size()) == a.stats().object_parts);
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::vector<std::string> direct = codegen::direct_references_to_undefined(parts[i]);
    CAPTURE(i, direct.size(), direct.empty() ? "" : direct[0]);
    CHECK(direct.empty());
  }
  // The disk cache keeps the parts together and links them all again.
  codegen::Executable b = compile_fresh(g);
  CHECK(b.stats().source == Source::DiskCache);
  CHECK(b.stats().disk_note.empty());
  CHECK(b.stats().object_parts == a.stats().object_parts);
  CHECK(b.stats().object_bytes == a.stats().object_bytes);
  CHECK(max_abs_diff(b.run({x})[0], want) < 1e-5);
}

TEST_CASE("cache: object bundles round-trip; a damaged bundle is an error, not a crash") {
  std::vector<std::string> parts = {"\x7f" "ELF one", "two", std::string(1000, 'x')};
  std::string bundle = codegen::bundle_objects(parts);
  std::vector<std::string_view> back = codegen::unbundle_objects(bundle);
  REQUIRE(back.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(back[i] == parts[i]);
  // One object is stored as itself.
  CHECK(codegen::bundle_objects({"\x7f" "ELF only"}) == "\x7f" "ELF only");
  CHECK(codegen::unbundle_objects("\x7f" "ELF only").size() == 1);
  // Cut short anywhere after the magic: kiln::Error.
  for (size_t cut : {size_t{9}, size_t{13}, size_t{30}, bundle.size() - 1}) {
    CAPTURE(cut);
    CHECK_THROWS_AS(codegen::unbundle_objects(std::string_view(bundle).substr(0, cut)), Error);
  }
}
