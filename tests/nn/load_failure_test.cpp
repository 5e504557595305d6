// Failed loads change nothing: load_state_dict validates every key and shape before it copies,
// and load_safetensors rejects malformed files (deep nesting, directories, bad BOOL bytes,
// duplicate names) with kiln::Error instead of crashing or loading garbage.
#include <catch2/catch.hpp>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <sys/resource.h>

#include "kiln/nn.h"

using namespace kiln;
using namespace kiln::nn;
using V = std::vector<float>;

namespace {
V vec(const Tensor& t) { return t.to_vector<float>(); }

void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    FAIL("no kiln::Error (expected one containing \"" << part << "\")");
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(part) != std::string::npos);
  }
}

// A safetensors file: the header as given, then `body`.
std::string write_st(const std::string& name, const std::string& header, const std::string& body) {
  std::string path = "/tmp/kiln_load_failure_test_" + name + ".safetensors";
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << body;
  return path;
}
}  // namespace

TEST_CASE("load_state_dict that fails leaves every parameter unchanged") {
  manual_seed(1);
  Linear lin(2, 3);
  const V w0 = vec(lin.weight), b0 = vec(lin.bias);
  auto unchanged = [&] {
    CHECK(vec(lin.weight) == w0);
    CHECK(vec(lin.bias) == b0);
  };
  SECTION("a later key with the wrong shape") {
    StateDict d{{"weight", full({3, 2}, 7.0)}, {"bias", full({5}, 7.0)}};
    expect_error([&] { lin.load_state_dict(d); }, "size mismatch for \"bias\"");
    unchanged();
  }
  SECTION("an unexpected key (strict)") {
    StateDict d{{"weight", full({3, 2}, 9.0)}, {"bias", full({3}, 9.0)}, {"extra", full({1}, 0.0)}};
    expect_error([&] { lin.load_state_dict(d); }, "unexpected keys in state dict: \"extra\"");
    unchanged();
    IncompatibleKeys keys = lin.load_state_dict(d, /*strict=*/false);  // loads, ignoring "extra"
    CHECK(keys.unexpected_keys == std::vector<std::string>{"extra"});
    CHECK(keys.missing_keys.empty());
    CHECK(vec(lin.bias) == V{9.f, 9.f, 9.f});
    CHECK(vec(lin.weight) == V(6, 9.f));
  }
  SECTION("a missing key (strict)") {
    StateDict d{{"weight", full({3, 2}, 9.0)}};
    expect_error([&] { lin.load_state_dict(d); }, "missing keys in state dict: \"bias\"");
    unchanged();
  }
  SECTION("every missing and unexpected key is named, as PyTorch names them") {
    StateDict d{{"w", full({3, 2}, 9.0)}, {"b", full({3}, 9.0)}};
    expect_error([&] { lin.load_state_dict(d); },
                 "missing keys in state dict: \"weight\", \"bias\"; unexpected keys in state "
                 "dict: \"w\", \"b\"");
    unchanged();
    IncompatibleKeys keys = lin.load_state_dict(d, /*strict=*/false);
    CHECK(keys.missing_keys == std::vector<std::string>{"weight", "bias"});
    CHECK(keys.unexpected_keys == std::vector<std::string>{"w", "b"});
    unchanged();
  }
  SECTION("an undefined tensor") {
    StateDict d{{"weight", full({3, 2}, 9.0)}, {"bias", Tensor()}};
    expect_error([&] { lin.load_state_dict(d); }, "\"bias\" is undefined");
    unchanged();
  }
  SECTION("a good dict of another dtype loads, converted") {
    StateDict d{{"weight", full({3, 2}, 2.0, Float64)}, {"bias", full({3}, 3, Int64)}};
    lin.load_state_dict(d);
    CHECK(vec(lin.weight) == V(6, 2.f));
    CHECK(vec(lin.bias) == V{3.f, 3.f, 3.f});
    CHECK(lin.weight.dtype() == Float32);
  }
}

TEST_CASE("load_safetensors: __metadata__ nested a million deep is an error, not a crash") {
  std::string h = R"({"__metadata__":)";
  for (int i = 0; i < 1000000; ++i) h += R"({"a":)";
  h += "1";
  h += std::string(1000000, '}');
  h += "}";
  expect_error([&] { load_safetensors(write_st("deep", h, "")); }, "nested more than 64 deep");
  // shallow nesting still loads
  std::string ok = R"({"__metadata__":{"a":{"b":"c"}},"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  float one = 1.f;
  StateDict d = load_safetensors(write_st("shallow", ok, std::string(reinterpret_cast<char*>(&one), 4)));
  REQUIRE(d.size() == 1);
  CHECK(vec(d[0].second) == V{1.f});
}

TEST_CASE("load_safetensors: a directory is a kiln::Error") {
  expect_error([] { load_safetensors("/tmp"); }, "is a directory");
}

TEST_CASE("load_safetensors: BOOL bytes other than 0 and 1 are rejected, naming the tensor") {
  std::string h = R"({"flags":{"dtype":"BOOL","shape":[4],"data_offsets":[0,4]}})";
  expect_error([&] { load_safetensors(write_st("bool_bad", h, std::string("\x01\x00\xff\x01", 4))); },
               "BOOL tensor \"flags\" holds byte 255 at element 2");
  StateDict d = load_safetensors(write_st("bool_ok", h, std::string("\x01\x00\x00\x01", 4)));
  CHECK(d[0].second.to(Int64).to_vector<int64_t>() == std::vector<int64_t>{1, 0, 0, 1});
  CHECK(d[0].second.sum().item<int64_t>() == 2);
}

TEST_CASE("load_safetensors: a bad shape names the file and the tensor") {
  // Found by a fresh-user trial: these errors came from empty() and Shape, naming neither.
  struct Case {
    std::string shape, body, message;
  };
  for (const Case& c : {
           Case{"[-2,-1]", std::string(8, '\0'), "negative size -2"},
           Case{"[4294967296,4294967296,4]", "", "too large"},
           Case{"[1,1,1,1,1,1,1,1,1,1,1,1,1]", std::string(4, '\0'), "has 13 dims"},
       }) {
    INFO(c.shape);
    std::string h = R"({"w":{"dtype":"F32","shape":)" + c.shape + R"(,"data_offsets":[0,)" +
                    std::to_string(c.body.size()) + "]}}";
    std::string path = write_st("bad_shape", h, c.body);
    expect_error([&] { load_safetensors(path); }, "load_safetensors: " + path);
    expect_error([&] { load_safetensors(path); }, "\"w\"");
    expect_error([&] { load_safetensors(path); }, c.message);
    expect_error([&] { load_safetensors(path); }, __FILE__);
  }
}

TEST_CASE("load_safetensors: a tensor name given twice is rejected") {
  std::string h = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error([&] { load_safetensors(write_st("dup", h, std::string(4, '\0'))); },
               "names \"a\" twice");
}

TEST_CASE("load_safetensors: names with JSON escapes decode as json.loads does") {
  // Python's json.dumps writes "né" as "n\u00e9" and an emoji as a surrogate pair; kiln raised
  // "unsupported \u escape" for anything past ASCII and read "\n" as "n".
  std::string h = R"({"n\u00e9":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("\ud83d\ude00x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                  R"("a\nb\"c\\d\/e":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  StateDict d = load_safetensors(write_st("escapes", h, std::string(12, '\0')));
  REQUIRE(d.size() == 3);
  CHECK(d[0].first == "n\xc3\xa9");
  CHECK(d[1].first == "\xf0\x9f\x98\x80x");
  CHECK(d[2].first == "a\nb\"c\\d/e");
  std::string lone = R"({"\ud83d":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error([&] { load_safetensors(write_st("lone", lone, std::string(4, '\0'))); },
               "lone surrogate");
  // kiln's own writer escapes control characters; they round-trip.
  StateDict mine = {{"tab\there", ones({1})}};
  save_safetensors(mine, "/tmp/kiln_load_failure_test_roundtrip.safetensors");
  CHECK(load_safetensors("/tmp/kiln_load_failure_test_roundtrip.safetensors")[0].first ==
        "tab\there");
}

TEST_CASE("load_safetensors: an empty header followed by garbage is rejected") {
  expect_error([&] { load_safetensors(write_st("empty_garbage", "{} garbage", "")); },
               "trailing bytes after the header");
  CHECK(load_safetensors(write_st("empty_ok", "{}  ", "")).empty());
}

TEST_CASE("save_safetensors: a name given twice or an undefined tensor is rejected before writing") {
  std::string path = "/tmp/kiln_load_failure_test_save_dup.safetensors";
  std::remove(path.c_str());
  expect_error([&] { save_safetensors({{"a", ones({1})}, {"a", zeros({2})}}, path); },
               "the name \"a\" is given twice");
  expect_error([&] { save_safetensors({{"w", Tensor()}}, path); }, "the tensor \"w\" is undefined");
  CHECK_FALSE(std::ifstream(path).good());  // nothing written
}

TEST_CASE("load_safetensors: the tensors' data must tile the bytes after the header") {
  const std::string f32 = R"("dtype":"F32","shape":[1])";
  auto header = [&](int a0, int a1, int b0, int b1) {
    return fmt::format(R"({{"a":{{{},"data_offsets":[{},{}]}},"b":{{{},"data_offsets":[{},{}]}}}})",
                       f32, a0, a1, f32, b0, b1);
  };
  const std::string eight(8, '\0');
  CHECK(load_safetensors(write_st("tile_ok", header(4, 8, 0, 4), eight)).size() == 2);
  expect_error([&] { load_safetensors(write_st("overlap", header(0, 4, 0, 4), eight)); },
               "the data of \"b\" starts at byte 0, not at 4");
  expect_error([&] { load_safetensors(write_st("gap", header(0, 4, 8, 12), eight + "1234")); },
               "the data of \"b\" starts at byte 8, not at 4");
  expect_error([&] { load_safetensors(write_st("trailing", header(0, 4, 4, 8), eight + "x")); },
               "1 bytes after the last tensor's data");
  expect_error([&] { load_safetensors(write_st("truncated", header(0, 4, 4, 8), "12345")); },
               "the file is truncated: its tensors need 8 bytes of data after the header, it "
               "has 5");
  expect_error([&] {
    load_safetensors(write_st("no_shape", R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", "1234"));
  }, "\"a\" has no shape");
  expect_error([&] {
    load_safetensors(write_st(
        "overflow", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,-9223372036854775807]}})",
        "1234"));
  }, "bad data_offsets for \"a\" (a F32 [1] tensor is 4 bytes)");
}

TEST_CASE("save_safetensors: __metadata__ is not a tensor name") {
  expect_error([&] {
    save_safetensors({{"__metadata__", ones({2})}}, "/tmp/kiln_load_failure_test_meta.safetensors");
  }, "the name \"__metadata__\" is reserved");
}

TEST_CASE("save_safetensors: a write that fails throws and keeps the earlier file") {
  const std::string path = "/tmp/kiln_load_failure_test_full.safetensors";
  save_safetensors({{"small", full({4}, 2.0)}}, path);
  // A file size limit makes the write fail part way (EFBIG, as a full disk fails it).
  struct rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 4096;
  setrlimit(RLIMIT_FSIZE, &small);
  std::string error;
  try {
    save_safetensors({{"big", zeros({100000})}}, path);
  } catch (const Error& e) {
    error = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  INFO(error);
  CHECK(error.find("write failed for \"" + path + "\"") != std::string::npos);
  StateDict kept = load_safetensors(path);  // the earlier checkpoint, whole
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].first == "small");
  CHECK(vec(kept[0].second) == V(4, 2.f));
  int others = 0;  // no temporary file left beside it
  for (const auto& e : std::filesystem::directory_iterator("/tmp"))
    others += e.path().filename().string().starts_with("kiln_load_failure_test_full.safetensors.");
  CHECK(others == 0);
  std::remove(path.c_str());
}

TEST_CASE("register_buffer(persistent = false): moved with the module, not in state_dict") {
  struct WithCache : Module {
    WithCache() {
      register_buffer("mean", zeros({2}));
      register_buffer("mask", ones({3}), /*persistent=*/false);
    }
    std::string name() const override { return "WithCache"; }
  };
  Sequential s{std::make_shared<WithCache>()};
  StateDict d = s.state_dict();
  REQUIRE(d.size() == 1);
  CHECK(d[0].first == "0.mean");
  CHECK(s.named_buffers().size() == 2);  // still a buffer
  s.load_state_dict(d);                  // strict: the mask is not expected
}

TEST_CASE("load_safetensors: an empty tensor at the offset of the next one loads") {
  // Found by review: the layout check sorted by start offset only, and with enough tensors
  // std::sort put [8, 12) before the empty [8, 8) and called the file overlapping.
  StateDict d;
  for (int i = 0; i < 48; ++i) {
    if (i == 2) d.push_back({"empty", zeros({0})});
    d.push_back({fmt::format("t{:02d}", i), full({1}, double(i))});
  }
  const std::string path = "/tmp/kiln_load_failure_test_empty.safetensors";
  save_safetensors(d, path);
  StateDict back = load_safetensors(path);
  REQUIRE(back.size() == 49);
  for (const auto& [name, t] : back) {
    if (name == "empty") CHECK(t.numel() == 0);
    else CHECK(vec(t) == V{float(std::stoi(name.substr(1)))});
  }
  std::filesystem::remove(path);
}
