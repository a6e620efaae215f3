#include "forge/ckpt/manifest.h"

#include "forge/common/error.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>

namespace forge::ckpt {

namespace {

Json number_or_null(double v) {
  return std::isfinite(v) ? Json(v) : Json(nullptr);
}
double number_or_nan(const Json& j) {
  return j.is_null() ? std::numeric_limits<double>::quiet_NaN() : j.get<double>();
}

}  // namespace

Json Manifest::to_json() const {
  Json files_json = Json::object();
  for (const auto& [name, f] : files) files_json[name] = {{"bytes", f.bytes}, {"xxh3", f.xxh3}};
  return Json{
      {"format", format},
      {"tier", tier},
      {"step", meta.step},
      {"tokens", meta.tokens},
      {"loss", number_or_null(meta.loss)},
      {"spec_hash", meta.spec_hash},
      {"dataset_version", meta.dataset_version},
      {"layout",
       {{"tp", meta.layout.tp},
        {"cp", meta.layout.cp},
        {"ep", meta.layout.ep},
        {"dp", meta.layout.dp},
        {"pp", meta.layout.pp}}},
      {"model_config", meta.model_config},
      {"data_cursor", meta.data_cursor},
      {"rng", meta.rng},
      {"verification", meta.verification},
      {"extra", meta.extra},
      {"world_size", world_size},
      {"created_unix", created_unix},
      {"save_stall_s", stall_s},
      {"write_s", write_s},
      {"files", files_json},
      {"promotion", promotion},
  };
}

Manifest Manifest::from_json(const Json& j, const std::string& where) {
  Manifest m;
  try {
    m.format = j.at("format").get<int>();
    if (m.format != kFormatVersion)
      fail(ExitCode::kData, "{}: checkpoint format {} is not supported (this build reads format {})", where,
           m.format, kFormatVersion);
    m.tier = j.at("tier").get<std::string>();
    m.meta.step = j.at("step").get<int64_t>();
    m.meta.tokens = j.at("tokens").get<int64_t>();
    m.meta.loss = number_or_nan(j.at("loss"));
    m.meta.spec_hash = j.at("spec_hash").get<std::string>();
    m.meta.dataset_version = j.at("dataset_version").get<std::string>();
    const Json& l = j.at("layout");
    m.meta.layout.tp = l.at("tp").get<int>();
    m.meta.layout.pp = l.at("pp").get<int>();
    m.meta.layout.dp = l.at("dp").get<int>();
    // Written before the layout had five dimensions: cp = ep = 1.
    m.meta.layout.cp = l.value("cp", 1);
    m.meta.layout.ep = l.value("ep", 1);
    m.meta.model_config = j.at("model_config");
    m.meta.data_cursor = j.at("data_cursor");
    m.meta.rng = j.at("rng");
    m.meta.verification = j.at("verification");
    m.meta.extra = j.value("extra", Json::object());
    m.world_size = j.at("world_size").get<int>();
    m.created_unix = j.at("created_unix").get<double>();
    m.stall_s = j.value("save_stall_s", 0.0);
    m.write_s = j.value("write_s", 0.0);
    for (const auto& [name, f] : j.at("files").items())
      m.files[name] = FileEntry{f.at("bytes").get<uint64_t>(), f.at("xxh3").get<std::string>()};
    m.promotion = j.value("promotion", Json());
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: not a checkpoint manifest: {}", where, e.what());
  }
  return m;
}

std::vector<std::string> json_differences(const Json& have, const Json& want, const std::string& path) {
  std::vector<std::string> out;
  const std::string here = path.empty() ? "(root)" : path;
  if (have.is_object() && want.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : have.items()) keys.insert(k);
    for (const auto& [k, v] : want.items()) keys.insert(k);
    for (const auto& k : keys) {
      const std::string sub = path.empty() ? k : path + "." + k;
      if (!have.contains(k))
        out.push_back(fmt::format("{}: absent in checkpoint, expected {}", sub, want[k].dump()));
      else if (!want.contains(k))
        out.push_back(fmt::format("{}: checkpoint {}, absent in expectation", sub, have[k].dump()));
      else {
        auto more = json_differences(have[k], want[k], sub);
        out.insert(out.end(), more.begin(), more.end());
      }
    }
  } else if (have != want) {
    out.push_back(fmt::format("{}: checkpoint {}, expected {}", here, have.dump(), want.dump()));
  }
  return out;
}

void check_expectations(const Manifest& manifest, const Expectations& expect, const std::string& where) {
  if (expect.model_config) {
    const auto diffs = json_differences(manifest.meta.model_config, *expect.model_config, "model");
    if (!diffs.empty())
      fail(ExitCode::kUsage,
           "{} was written for another model config ({}); resume with the model it was trained with, or "
           "use another run directory",
           where, fmt::join(diffs, "; "));
  }
  if (expect.dataset_version && manifest.meta.dataset_version != *expect.dataset_version)
    fail(ExitCode::kData,
         "{} was trained on dataset version '{}', but this job reads '{}'; point data.dataset at the "
         "dataset it was trained on",
         where, manifest.meta.dataset_version, *expect.dataset_version);
}

}  // namespace forge::ckpt
