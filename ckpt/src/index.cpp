#include "index.h"

#include <fmt/ranges.h>

#include <algorithm>

namespace forge::ckpt::detail {

Json index_to_json(const std::map<std::string, TensorEntry>& tensors) {
  Json out = Json::object();
  for (const auto& [name, t] : tensors) {
    Json pieces = Json::array();
    for (const auto& p : t.pieces)
      pieces.push_back({{"file", p.file},
                        {"at", p.at},
                        {"offset", p.slice.offset},
                        {"count", p.slice.count},
                        {"begin", p.slice.begin},
                        {"end", p.slice.end}});
    out[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"pieces", pieces}};
  }
  return Json{{"format", 1}, {"tensors", out}};
}

std::map<std::string, TensorEntry> index_from_json(const Json& j, const std::string& where) {
  std::map<std::string, TensorEntry> out;
  try {
    for (const auto& [name, tj] : j.at("tensors").items()) {
      TensorEntry t;
      t.name = name;
      t.dtype = parse_dtype(tj.at("dtype").get<std::string>());
      t.shape = tj.at("shape").get<std::vector<int64_t>>();
      for (const auto& pj : tj.at("pieces")) {
        StoredPiece p;
        p.slice.name = name;
        p.slice.dtype = t.dtype;
        p.slice.shape = t.shape;
        p.slice.offset = pj.at("offset").get<std::vector<int64_t>>();
        p.slice.count = pj.at("count").get<std::vector<int64_t>>();
        p.slice.begin = pj.at("begin").get<int64_t>();
        p.slice.end = pj.at("end").get<int64_t>();
        p.file = pj.at("file").get<std::string>();
        p.at = pj.at("at").get<uint64_t>();
        if (p.file.find('/') != std::string::npos || p.file.empty() || p.file[0] == '.')
          fail(ExitCode::kData, "{}: tensor '{}' names the file '{}' outside the checkpoint", where, name,
               p.file);
        try {
          p.slice = p.slice.normalized();
        } catch (const Error& e) {
          fail(ExitCode::kData, "{}: {}", where, e.what());
        }
        p.runs = runs_of(p.slice);
        t.pieces.push_back(std::move(p));
      }
      check_coverage(t, ExitCode::kData,
                     [&](size_t i) { return fmt::format("piece in '{}'", t.pieces[i].file); });
      out.emplace(name, std::move(t));
    }
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: not a checkpoint index: {}", where, e.what());
  }
  return out;
}

void check_coverage(const TensorEntry& t, ExitCode code, const std::function<std::string(size_t)>& who) {
  struct Tagged {
    int64_t lo, hi;
    size_t piece;
  };
  std::vector<Tagged> all;
  for (size_t i = 0; i < t.pieces.size(); ++i)
    for (const Run& r : t.pieces[i].runs) all.push_back({r.lo, r.hi, i});
  std::sort(all.begin(), all.end(), [](const Tagged& a, const Tagged& b) { return a.lo < b.lo; });
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  int64_t next = 0;
  size_t last_piece = 0;
  for (const Tagged& r : all) {
    if (r.lo < next)
      fail(code, "tensor '{}': the {} and the {} both hold element {}", t.name, who(last_piece), who(r.piece),
           coords_of(t.shape, r.lo));
    if (r.lo > next)
      fail(code, "tensor '{}' {}: elements {} to {} are in no piece", t.name, fmt::format("{}", t.shape),
           coords_of(t.shape, next), coords_of(t.shape, r.lo - 1));
    next = r.hi;
    last_piece = r.piece;
  }
  if (next < numel)
    fail(code, "tensor '{}' {}: elements {} to {} are in no piece", t.name, fmt::format("{}", t.shape),
         coords_of(t.shape, next), coords_of(t.shape, numel - 1));
}

}  // namespace forge::ckpt::detail
