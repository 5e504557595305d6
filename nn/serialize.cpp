#include "nn/serialize.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <tuple>
#include <unordered_set>

#include <unistd.h>

#include "eager/factories.h"

namespace kiln::nn {
namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::Bool: return "BOOL";
    case DType::Int32: return "I32";
    case DType::Int64: return "I64";
    case DType::Float32: return "F32";
    case DType::Float64: return "F64";
  }
  return "";
}

DType from_st_dtype(const std::string& s, const std::string& path, Loc loc) {
  for (DType t : {DType::Bool, DType::Int32, DType::Int64, DType::Float32, DType::Float64})
    if (s == st_dtype(t)) return t;
  throw Error("load_safetensors", fmt::format("{}: unsupported dtype \"{}\"", path, s), loc);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
      continue;
    }
    out += c;
  }
  return out;
}

// A tiny reader for the header's JSON: objects, strings, integers and arrays of integers.
struct Reader {
  const std::string& s;
  const std::string& path;
  Loc loc;
  size_t i = 0;
  [[noreturn]] void fail(const char* what) {
    throw Error("load_safetensors",
                fmt::format("{}: corrupt header at byte {} ({})", path, i, what), loc);
  }
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  bool peek(char c) {
    ws();
    return i < s.size() && s[i] == c;
  }
  void expect(char c) {
    if (!peek(c)) fail("unexpected character");
    ++i;
  }
  // The 4 hex digits after the "\\u" at s[i] (JSON, RFC 8259 section 7); i moves past them.
  uint32_t code_unit() {
    if (i + 4 >= s.size()) fail("truncated \\u escape");
    uint32_t code = 0;
    for (size_t k = i + 1; k <= i + 4; ++k) {
      char c = s[k];
      int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0'
              : (c >= 'a' && c <= 'f')                   ? c - 'a' + 10
              : (c >= 'A' && c <= 'F')                   ? c - 'A' + 10
                                                         : -1;
      if (d < 0) fail("bad \\u escape");
      code = code * 16 + static_cast<uint32_t>(d);
    }
    i += 5;
    return code;
  }
  static void put_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  // A JSON string: escapes decoded (\\uXXXX, surrogate pairs included, to UTF-8), as Python's
  // json.dumps writes non-ASCII names by default.
  std::string string() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      if (s[i] != '\\') {
        out += s[i++];
        continue;
      }
      if (++i >= s.size()) break;
      switch (s[i]) {
        case 'u': {
          uint32_t cp = code_unit();
          if (cp >= 0xD800 && cp <= 0xDBFF) {  // a high surrogate: its low half must follow
            if (i + 1 >= s.size() || s[i] != '\\' || s[i + 1] != 'u') fail("lone surrogate");
            ++i;
            uint32_t low = code_unit();
            if (low < 0xDC00 || low > 0xDFFF) fail("lone surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone surrogate");
          }
          put_utf8(out, cp);
          continue;
        }
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case '"': case '\\': case '/': out += s[i]; break;
        default: fail("bad escape");
      }
      ++i;
    }
    if (i >= s.size()) fail("unterminated string");
    ++i;
    return out;
  }
  int64_t integer() {
    ws();
    size_t start = i;
    if (i < s.size() && s[i] == '-') ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    if (start == i) fail("expected an integer");
    try {
      return std::stoll(s.substr(start, i - start));
    } catch (const std::exception&) {
      fail("integer out of range");
    }
  }
  std::vector<int64_t> int_array() {
    std::vector<int64_t> out;
    expect('[');
    if (peek(']')) return ++i, out;
    do out.push_back(integer());
    while (peek(',') && ++i);
    expect(']');
    return out;
  }
  // Objects nested deeper than this are rejected: the recursion below must not overflow the
  // stack on a crafted header (a million nested objects crashed the loader).
  static constexpr int kMaxDepth = 64;
  void skip_value(int depth = 0) {  // for __metadata__: an object of strings
    if (peek('{')) {
      if (depth >= kMaxDepth) fail("objects nested more than 64 deep");
      ++i;
      if (peek('}')) return void(++i);
      do {
        string();
        expect(':');
        skip_value(depth + 1);
      } while (peek(',') && ++i);
      expect('}');
    } else if (peek('"')) {
      string();
    } else if (peek('[')) {
      int_array();
    } else {
      integer();
    }
  }
};

}  // namespace

void save_safetensors(const StateDict& dict, const std::string& path, Loc loc) {
  at_user_line(loc, [&] {  // st_dtype's error for an unsupported dtype names the caller
  std::string header = "{";
  size_t offset = 0;
  std::vector<Tensor> data;
  std::unordered_set<std::string> names;
  for (const auto& [name, t] : dict) {
    // The format maps names to tensors: a name given twice would make a file no reader loads.
    KILN_CHECK(names.insert(name).second, "save_safetensors", loc,
               "the name \"{}\" is given twice", name);
    KILN_CHECK(name != "__metadata__", "save_safetensors", loc,
               "the name \"__metadata__\" is reserved by the format for its metadata");
    KILN_CHECK(t.defined(), "save_safetensors", loc, "the tensor \"{}\" is undefined", name);
    Tensor c = t.detach().to(Device::cpu(), loc).contiguous();  // a CUDA tensor's bytes too
    size_t nbytes = static_cast<size_t>(c.numel()) * c.itemsize();
    header += fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                          header.size() > 1 ? "," : "", json_escape(name), st_dtype(c.dtype()),
                          fmt::join(c.shape(), ","), offset, offset + nbytes);
    offset += nbytes;
    data.push_back(c);
  }
  header += "}";
  while (header.size() % 8) header += ' ';  // the format pads the header with spaces
  // Written to a temporary file beside `path` and renamed over it once complete, so a failed
  // save (disk full) leaves an earlier checkpoint at `path` as it was.
  const std::string tmp = fmt::format("{}.tmp-{}", path, static_cast<long>(::getpid()));
  auto fail = [&](const char* what) {
    int err = errno;
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw Error("save_safetensors", fmt::format("{} \"{}\": {}", what, path, std::strerror(err)),
                loc);
  };
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  if (!f.good()) fail("cannot open");
  uint64_t n = header.size();  // little-endian on every platform kiln supports
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const Tensor& c : data)
    f.write(static_cast<const char*>(c.raw_data()),
            static_cast<std::streamsize>(static_cast<size_t>(c.numel()) * c.itemsize()));
  f.close();  // the last buffered bytes are written here: check after it
  if (f.fail()) fail("write failed for");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot replace");
  });
}

namespace {
// One tensor's entry in the header.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin = 0, end = 0;  // bytes, relative to the data after the header
};

// Checks the entries against the format: each one's offsets span exactly its bytes, and in
// offset order they tile the data with no gap, overlap or trailing bytes (as the reference
// loader demands). `data_size` is the file's size after the header.
void check_layout(std::vector<Entry> entries, uint64_t data_size, const std::string& path,
                  Loc loc) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) {  // an empty tensor before one at its offset
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  uint64_t at = 0;
  for (const Entry& e : entries) {
    KILN_CHECK(static_cast<uint64_t>(e.begin) == at, "load_safetensors", loc,
               "{}: the data of \"{}\" starts at byte {}, not at {} where the previous tensor's "
               "ends (overlapping or with a gap)",
               path, e.name, e.begin, at);
    at = static_cast<uint64_t>(e.end);
  }
  KILN_CHECK(at <= data_size, "load_safetensors", loc,
             "{}: the file is truncated: its tensors need {} bytes of data after the header, "
             "it has {}",
             path, at, data_size);
  KILN_CHECK(at == data_size, "load_safetensors", loc,
             "{}: {} bytes after the last tensor's data (a corrupt file)", path, data_size - at);
}
}  // namespace

StateDict load_safetensors(const std::string& path, Loc loc) {
  return at_user_line(loc, [&]() -> StateDict {  // empty()'s shape errors name the caller
  std::error_code ec;
  KILN_CHECK(!std::filesystem::is_directory(path, ec), "load_safetensors", loc,
             "\"{}\" is a directory, not a safetensors file", path);
  std::ifstream f(path, std::ios::binary);
  KILN_CHECK(f.good(), "load_safetensors", loc, "cannot open \"{}\": {}", path,
             std::strerror(errno));
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  KILN_CHECK(!ec, "load_safetensors", loc, "cannot read \"{}\": {}", path, ec.message());
  KILN_CHECK(file_size >= 8, "load_safetensors", loc, "{}: file too short", path);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  KILN_CHECK(n <= file_size - 8, "load_safetensors", loc,
             "{}: header size {} exceeds the file size {}", path, n, file_size);
  std::string header(n, '\0');
  f.read(header.data(), static_cast<std::streamsize>(n));
  KILN_CHECK(f.good(), "load_safetensors", loc, "cannot read \"{}\"", path);
  const uint64_t data_size = file_size - 8 - n;
  Reader r{header, path, loc};
  std::vector<Entry> entries;
  std::unordered_set<std::string> names;
  r.expect('{');
  if (!r.peek('}')) do {
    std::string name = r.string();
    KILN_CHECK(names.insert(name).second, "load_safetensors", loc,
               "{}: the header names \"{}\" twice", path, name);
    r.expect(':');
    if (name == "__metadata__") {
      r.skip_value();
      continue;
    }
    std::string dtype;
    std::optional<std::vector<int64_t>> shape, offsets;
    r.expect('{');
    do {
      std::string key = r.string();
      r.expect(':');
      if (key == "dtype") dtype = r.string();
      else if (key == "shape") shape = r.int_array();
      else if (key == "data_offsets") offsets = r.int_array();
      else r.skip_value();
    } while (r.peek(',') && ++r.i);
    r.expect('}');
    Entry e{name, from_st_dtype(dtype, path, loc), {}};
    KILN_CHECK(shape.has_value(), "load_safetensors", loc, "{}: \"{}\" has no shape", path,
               name);
    KILN_CHECK(shape->size() <= static_cast<size_t>(kMaxRank), "load_safetensors", loc,
               "{}: the shape of \"{}\" has {} dims (kiln's maximum rank is {})", path, name,
               shape->size(), kMaxRank);
    e.shape = Shape(*shape);
    try {  // a negative size, or more elements than memory can hold
      check_shape(e.shape, itemsize(e.dtype), "load_safetensors", loc);
    } catch (const Error& err) {
      throw Error("load_safetensors",
                  fmt::format("{}: bad shape for \"{}\": {}", path, name, err.message()), loc);
    }
    const uint64_t nbytes = static_cast<uint64_t>(numel(e.shape)) * itemsize(e.dtype);
    KILN_CHECK(offsets && offsets->size() == 2 && (*offsets)[0] >= 0 &&
                   (*offsets)[1] >= (*offsets)[0] &&
                   static_cast<uint64_t>((*offsets)[1] - (*offsets)[0]) == nbytes,
               "load_safetensors", loc,
               "{}: bad data_offsets for \"{}\" (a {} {} tensor is {} bytes)", path, name,
               st_dtype(e.dtype), to_string(e.shape), nbytes);
    e.begin = (*offsets)[0];
    e.end = (*offsets)[1];
    entries.push_back(std::move(e));
  } while (r.peek(',') && ++r.i);
  r.expect('}');
  r.ws();
  if (r.i != header.size()) r.fail("trailing bytes after the header");
  check_layout(entries, data_size, path, loc);
  // Each tensor is read from the file straight into its own memory.
  StateDict out;
  for (const Entry& e : entries) {
    Tensor x = empty(e.shape, {e.dtype});
    f.seekg(static_cast<std::streamoff>(8 + n + static_cast<uint64_t>(e.begin)));
    f.read(static_cast<char*>(x.raw_data()), static_cast<std::streamsize>(e.end - e.begin));
    KILN_CHECK(f.good(), "load_safetensors", loc, "{}: cannot read the data of \"{}\"", path,
               e.name);
    if (e.dtype == DType::Bool) {  // a bool is one byte, 0 or 1; anything else is not a bool
      const auto* b = static_cast<const unsigned char*>(x.raw_data());
      for (int64_t k = 0; k < e.end - e.begin; ++k)
        KILN_CHECK(b[k] <= 1, "load_safetensors", loc,
                   "{}: BOOL tensor \"{}\" holds byte {} at element {} (a bool must be 0 or 1)",
                   path, e.name, int(b[k]), k);
    }
    out.emplace_back(e.name, x);
  }
  return out;
  });
}

}  // namespace kiln::nn
