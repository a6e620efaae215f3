// Import and export in the Hugging Face layout (hf.h): the file handling around the mapping of hf.cpp.
#include "forge/ckpt/safetensors.h"
#include "forge/ckpt/writer.h"
#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/json.h"
#include "forge/trainer/checkpoint_io.h"
#include "forge/trainer/hf.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <regex>
#include <set>

namespace forge::trainer {

namespace fs = std::filesystem;

namespace {

// The files besides the weights that a model directory may hold and a checkpoint keeps.
constexpr std::string_view kModelFiles[] = {
    "config.json",     "generation_config.json",  "tokenizer.json",     "tokenizer_config.json",
    "tokenizer.model", "special_tokens_map.json", "chat_template.jinja"};
constexpr const char* kIndexName = "model.safetensors.index.json";

float half_to_float(uint16_t h) {
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
}

// Element i of a published tensor as FP32.
float element(const ckpt::SafeTensor& t, int64_t i) {
  uint16_t h;
  switch (t.dtype) {
    case ckpt::DType::kF32: {
      float f;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      return f;
    }
    case ckpt::DType::kBF16: {
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      const uint32_t bits = uint32_t(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default:
      std::memcpy(&h, t.bytes.data() + 2 * i, 2);
      return half_to_float(h);
  }
}

// FP32 to the published element type, rounding to nearest even (BF16 NaNs stay NaN).
template <ckpt::DType D>
void store(float f, std::byte* out) {
  if constexpr (D == ckpt::DType::kF32) {
    std::memcpy(out, &f, 4);
  } else if constexpr (D == ckpt::DType::kBF16) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7f800000u) != 0x7f800000u)
      bits += 0x7fffu + ((bits >> 16) & 1u);
    else if (bits & 0x007fffffu)
      bits |= 0x00400000u;
    const uint16_t h = uint16_t(bits >> 16);
    std::memcpy(out, &h, 2);
  } else {
    const _Float16 v = static_cast<_Float16>(f);
    std::memcpy(out, &v, 2);
  }
}

// n values to published elements; the element type is chosen once, outside the loop, so that it
// vectorizes.
template <ckpt::DType D>
void store_all(const float* values, size_t n, std::byte* out) {
  constexpr size_t esize = D == ckpt::DType::kF32 ? 4 : 2;
  for (size_t i = 0; i < n; ++i) store<D>(values[i], out + i * esize);
}
void store_all(ckpt::DType dtype, const float* values, size_t n, std::byte* out) {
  switch (dtype) {
    case ckpt::DType::kF32:
      return store_all<ckpt::DType::kF32>(values, n, out);
    case ckpt::DType::kBF16:
      return store_all<ckpt::DType::kBF16>(values, n, out);
    default:
      return store_all<ckpt::DType::kF16>(values, n, out);
  }
}

// [rows, cols] row-major to [cols, rows], in tiles that stay in cache.
void transpose(const float* in, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) out[c * rows + r] = in[r * cols + c];
}

// The element type most of a model's bytes are stored in (F32 when none).
ckpt::DType most_bytes(const std::map<ckpt::DType, uint64_t>& bytes_by_dtype) {
  ckpt::DType dtype = ckpt::DType::kF32;
  uint64_t most = 0;
  for (const auto& [d, b] : bytes_by_dtype)
    if (b > most) most = b, dtype = d;
  return dtype;
}

std::string_view torch_dtype_name(ckpt::DType d) {
  return d == ckpt::DType::kBF16 ? "bfloat16" : d == ckpt::DType::kF16 ? "float16" : "float32";
}

ckpt::DType dtype_from_option(const std::string& name) {
  if (name == "f32" || name == "float32") return ckpt::DType::kF32;
  if (name == "bf16" || name == "bfloat16") return ckpt::DType::kBF16;
  if (name == "f16" || name == "float16") return ckpt::DType::kF16;
  fail(ExitCode::kUsage, "--dtype {}: give f32, bf16 or f16", name);
}

Json read_json_file(const fs::path& path) {
  try {
    return Json::parse(read_file(path.string()));
  } catch (const Json::exception& e) {
    fail(ExitCode::kData, "{}: not JSON: {}", path.string(), e.what());
  }
}

// Model id and revision: from the config, or from a hub cache path (models--ORG--NAME/snapshots/REV).
void identify(const fs::path& dir, const Json& config, Json& origin) {
  static const std::regex hub(R"(models--([^/]+)--([^/]+)/snapshots/([0-9a-f]{7,64})/?$)");
  std::smatch m;
  const std::string path = dir.string();
  if (std::regex_search(path, m, hub)) {
    origin["model_id"] = m[1].str() + "/" + m[2].str();
    origin["revision"] = m[3].str();
  }
  const std::string id = config.value("_name_or_path", "");
  static const std::regex model_id(R"([A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)");
  if (!origin.contains("model_id") && std::regex_match(id, model_id)) origin["model_id"] = id;
  if (!origin.contains("revision") && config.contains("_commit_hash") && config["_commit_hash"].is_string())
    origin["revision"] = config["_commit_hash"];
}

struct Source {
  std::string name;  // file name in the directory
  ckpt::SafetensorsFile file;
};

// The safetensors files of `dir`, single or sharded, and which file the index says holds each tensor.
std::vector<Source> open_weights(const fs::path& dir, std::map<std::string, std::string>& index_map) {
  std::vector<std::string> names;
  if (fs::exists(dir / kIndexName)) {
    const Json index = read_json_file(dir / kIndexName);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(ExitCode::kData, "{}: no weight_map object", (dir / kIndexName).string());
    std::set<std::string> files;
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos ||
          file.get<std::string>().rfind("..", 0) == 0)
        fail(ExitCode::kData, "{}: tensor '{}' maps to {}, not a file of the directory",
             (dir / kIndexName).string(), tensor, file.dump());
      index_map[tensor] = file.get<std::string>();
      files.insert(file.get<std::string>());
    }
    names.assign(files.begin(), files.end());
  } else if (fs::exists(dir / "model.safetensors")) {
    names = {"model.safetensors"};
  } else {
    fail(ExitCode::kData,
         "{}: neither model.safetensors nor {} (pickled pytorch_model.bin files are not read: save the "
         "model with safetensors)",
         dir.string(), kIndexName);
  }
  std::vector<Source> out;
  for (const auto& n : names) {
    if (!fs::exists(dir / n))
      fail(ExitCode::kData, "{}: {} names '{}', which is missing", dir.string(), kIndexName, n);
    out.push_back({n, ckpt::SafetensorsFile::open((dir / n).string())});
  }
  return out;
}

void exchange_into(const std::string& staging, const std::string& out) {
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) == 0) return;
  if (errno != EEXIST || ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, out.c_str(), RENAME_EXCHANGE) != 0)
    fail(ExitCode::kIo, "cannot rename '{}' to '{}': {}", staging, out, std::strerror(errno));
  std::error_code ec;
  fs::remove_all(staging, ec);  // now the replaced directory
}

// A buffer that grows and is reused, never zero-filled.
template <typename T>
class HostBuffer {
 public:
  void reserve(size_t n) {
    if (n > capacity_) data_.reset(new T[n]), capacity_ = n;
  }
  T* data() { return data_.get(); }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  std::unique_ptr<T[]> data_;
  size_t capacity_ = 0;
};

std::string nonce() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

}  // namespace

HfImport import_hf(const std::string& dir_name, const std::string& out, bool replace) {
  const fs::path dir = fs::absolute(dir_name).lexically_normal();
  if (!fs::is_directory(dir)) fail(ExitCode::kUsage, "'{}' is not a directory", dir_name);
  if (!fs::exists(dir / "config.json"))
    fail(ExitCode::kData, "{}: no config.json: not a Hugging Face model directory", dir_name);
  const Json config = read_json_file(dir / "config.json");
  HfImport result;
  result.spec = spec_from_hf_config(config, (dir / "config.json").string());
  const ModelSpec& spec = result.spec;
  result.architecture = config.contains("architectures") ? config["architectures"][0].get<std::string>()
                                                         : config.value("model_type", "");

  std::map<std::string, std::string> index_map;
  std::vector<Source> sources = open_weights(dir, index_map);
  std::map<std::string, const HfTensor*> wanted;
  const std::vector<HfTensor> mapping = hf_tensors(spec);
  for (const HfTensor& t : mapping) wanted[t.name] = &t;

  // Check every tensor against the model the config describes before anything is written.
  std::map<std::string, std::pair<const Source*, const ckpt::SafeTensor*>> found;
  const ckpt::SafeTensor* tied_head = nullptr;
  const Source* tied_head_file = nullptr;
  std::map<ckpt::DType, uint64_t> dtype_bytes;
  for (const Source& s : sources) {
    result.bytes += s.file.size();
    for (const ckpt::SafeTensor& t : s.file.tensors()) {
      const std::string name = hf_canonical_name(spec, t.name);
      const std::string where = (dir / s.name).string();
      if (!index_map.empty() && (!index_map.count(t.name) || index_map.at(t.name) != s.name))
        fail(ExitCode::kData, "{}: tensor '{}' is not where {} says it is", where, t.name, kIndexName);
      if (hf_ignored_tensor(name)) continue;
      if (spec.tied_embeddings && name == hf_tied_head_name(spec)) {
        tied_head = &t;
        tied_head_file = &s;
        continue;
      }
      const auto w = wanted.find(name);
      if (w == wanted.end())
        fail(ExitCode::kData, "{}: tensor '{}' is not part of a {} with this config.json (an extra tensor)",
             where, t.name, result.architecture);
      if (t.shape != w->second->shape)
        fail(ExitCode::kData, "{}: tensor '{}' has shape {}, but config.json makes it {}", where, t.name,
             fmt::format("{}", t.shape), fmt::format("{}", w->second->shape));
      if (!found.emplace(name, std::make_pair(&s, &t)).second)
        fail(ExitCode::kData, "{}: tensor '{}' appears twice", where, t.name);
      dtype_bytes[t.dtype] += t.bytes.size();
    }
  }
  for (const HfTensor& t : mapping)
    if (!found.count(t.name))
      fail(ExitCode::kData, "{}: tensor '{}' is missing (config.json describes a {} that has it)",
           dir.string(), t.name, result.architecture);
  for (const auto& [name, file] : index_map)
    if (!hf_ignored_tensor(hf_canonical_name(spec, name)) && !found.count(hf_canonical_name(spec, name)) &&
        !(tied_head && name == tied_head->name))
      fail(ExitCode::kData, "{}: {} lists tensor '{}', which {} does not hold", dir.string(), kIndexName,
           name, file);
  if (tied_head) {
    const auto is_embedding = [](const HfTensor& t) { return t.param == "wte.weight"; };
    const auto* embedding = found.at(std::find_if(mapping.begin(), mapping.end(), is_embedding)->name).second;
    if (tied_head->dtype != embedding->dtype || tied_head->shape != embedding->shape ||
        std::memcmp(tied_head->bytes.data(), embedding->bytes.data(), embedding->bytes.size()) != 0)
      fail(ExitCode::kData,
           "{}: tensor '{}' differs from the embedding, but tie_word_embeddings makes them one: set "
           "tie_word_embeddings to false",
           (dir / tied_head_file->name).string(), tied_head->name);
  }
  result.dtype = torch_dtype_name(most_bytes(dtype_bytes));

  // One pass over each file in order: hash it, and convert every tensor into its checkpoint piece.
  ckpt::CheckpointWriter writer(out, replace);
  Json files = Json::object();
  for (const Source& s : sources) {
    Sha256Stream sha;
    sha.update(s.file.header().data(), s.file.header().size());
    for (const ckpt::SafeTensor& t : s.file.tensors()) {
      sha.update(t.bytes.data(), t.bytes.size());
      const auto w = wanted.find(hf_canonical_name(spec, t.name));
      if (w != wanted.end() && !hf_ignored_tensor(w->first)) {
        const HfTensor& m = *w->second;
        ckpt::Slice piece = ckpt::Slice::whole("param/" + m.param, m.param_shape);
        piece.offset = m.offset;
        piece.count = m.count;
        const int64_t rows = m.param_shape[0], cols = m.param_shape.size() > 1 ? m.param_shape[1] : 1;
        writer.add(piece, [&](int64_t first, std::span<std::byte> bytes) {
          float* dst = reinterpret_cast<float*>(bytes.data());
          const int64_t n = static_cast<int64_t>(bytes.size() / 4);
          if (m.transposed)  // forge [rows, cols] element (r, c) is published (c, r)
            for (int64_t i = 0; i < n; ++i)
              dst[i] = element(t, ((first + i) % cols) * rows + (first + i) / cols);
          else if (t.dtype == ckpt::DType::kF32)
            std::memcpy(dst, t.bytes.data() + 4 * first, bytes.size());
          else
            for (int64_t i = 0; i < n; ++i) dst[i] = element(t, first + i);
        });
      }
      s.file.release(t);
    }
    files[s.name] = sha.hex();
  }
  if (!index_map.empty()) {
    const std::string bytes = read_file((dir / kIndexName).string());
    files[kIndexName] = sha256_hex(bytes);
  }
  std::string tokenizer_sha256;
  for (const auto name : kModelFiles) {
    if (!fs::exists(dir / name)) continue;
    const std::string bytes = read_file((dir / name).string());
    files[std::string(name)] = sha256_hex(bytes);
    writer.add_file(std::string(name), bytes);
    if (name == "tokenizer.json" || (name == "tokenizer.model" && tokenizer_sha256.empty()))
      tokenizer_sha256 = sha256_hex(bytes);
  }
  result.tensors = 0;
  for (const Source& s : sources) result.tensors += s.file.tensors().size();
  result.origin = {{"format", "hf"},
                   {"source", dir.string()},
                   {"architecture", result.architecture},
                   {"torch_dtype", result.dtype},
                   {"files", files}};
  identify(dir, config, result.origin);

  ckpt::CheckpointMeta meta;
  meta.loss = NAN;
  meta.model_config = model_spec_json(spec);
  meta.extra = {{"origin", result.origin}, {"tokenizer_sha256", tokenizer_sha256}};
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  writer.commit(ckpt::Tier::kRelease, meta, {{"source", dir.string()}, {"imported_unix", now}});
  return result;
}

HfExport export_hf(const ckpt::Checkpoint& checkpoint, const std::string& out_name,
                   const HfExportOptions& options) {
  const ckpt::Manifest& manifest = checkpoint.manifest();
  ModelSpec spec = model_spec_from_json(manifest.meta.model_config, checkpoint.dir());
  spec.value_head = false;  // the policy is handed back; PPO's critic stays with the checkpoint
  const Json origin = manifest.meta.extra.value("origin", Json());
  std::string dtype_name = options.dtype;
  if (dtype_name.empty())
    dtype_name = origin.is_object() ? origin.value("torch_dtype", "float32") : "float32";
  const ckpt::DType dtype = dtype_from_option(dtype_name);
  const auto kept = [&](const std::string& name) -> std::optional<std::string> {
    if (!manifest.files.count(name)) return std::nullopt;
    return read_file((fs::path(checkpoint.dir()) / name).string());
  };
  const std::optional<std::string> kept_config = kept("config.json");
  Json base = kept_config ? Json::parse(*kept_config) : Json::object();
  base.update(options.config_keys);
  const Json config = hf_config(spec, base, torch_dtype_name(dtype));

  const fs::path out = fs::absolute(out_name).lexically_normal();
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)) && !options.replace)
    fail(ExitCode::kUsage,
         "'{}' exists and is not empty: choose another --out, or give --force to replace it", out_name);
  fs::create_directories(out.parent_path(), ec);
  const fs::path staging =
      out.parent_path() / fmt::format(".{}.partial-{}", out.filename().string(), nonce());
  fs::create_directory(staging, ec);
  if (ec) fail(ExitCode::kIo, "cannot create '{}': {}", staging.string(), ec.message());
  HfExport result;
  try {
    // Shards of at most shard_bytes of tensor data, in published order (one tensor may exceed it alone).
    const std::vector<HfTensor> mapping = hf_tensors(spec);
    std::vector<std::vector<ckpt::SafeTensorOut>> shards(1);
    // One tensor at a time, reused: fresh pages would cost a fault each.
    HostBuffer<float> values, transposed;
    uint64_t in_shard = 0, total = 0;
    for (const HfTensor& m : mapping) {
      uint64_t bytes = ckpt::dtype_size(dtype);
      for (int64_t d : m.shape) bytes *= static_cast<uint64_t>(d);
      if (in_shard > 0 && in_shard + bytes > options.shard_bytes) {
        shards.emplace_back();
        in_shard = 0;
      }
      in_shard += bytes;
      total += bytes;
      shards.back().push_back(
          {m.name, dtype, m.shape, [&checkpoint, &m, dtype, &values, &transposed](std::span<std::byte> buf) {
             ckpt::Slice piece = ckpt::Slice::whole("param/" + m.param, m.param_shape);
             piece.offset = m.offset;
             piece.count = m.count;
             const size_t n = static_cast<size_t>(piece.normalized().elements());
             values.reserve(n);
             checkpoint.read({{piece, values.data()}});
             const float* published = values.data();
             if (m.transposed) {
               transposed.reserve(n);
               transpose(values.data(), m.param_shape[0], m.param_shape[1], transposed.data());
               published = transposed.data();
             }
             store_all(dtype, published, n, buf.data());
           }});
    }
    // The checkpoint's checksums are verified alongside (the other core): the export is published only
    // when they hold.
    std::future<void> verified = std::async(std::launch::async, [&checkpoint] { checkpoint.verify(); });
    std::map<std::string, std::string> sha256;  // of the weights, as written
    const Json metadata = {{"format", "pt"}};
    const auto write = [&](const std::string& name, std::string_view bytes) {
      write_file_atomic((staging / name).string(), bytes);
    };
    if (shards.size() == 1) {
      sha256["model.safetensors"] =
          ckpt::write_safetensors((staging / "model.safetensors").string(), shards[0], metadata);
    } else {
      Json weight_map = Json::object();
      for (size_t k = 0; k < shards.size(); ++k) {
        const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", k + 1, shards.size());
        sha256[name] = ckpt::write_safetensors((staging / name).string(), shards[k], metadata);
        for (const auto& t : shards[k]) weight_map[t.name] = name;
      }
      write(kIndexName,
            Json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
    }
    write("config.json", config.dump(2) + "\n");
    std::map<std::string, std::string> files = options.files;
    for (const auto name : kModelFiles)
      if (name != "config.json" && !files.count(std::string(name)))
        if (const auto bytes = kept(std::string(name))) files[std::string(name)] = *bytes;
    if (!files.count("generation_config.json")) {
      Json generation = Json::object();
      for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (config.contains(key)) generation[key] = config[key];
      files["generation_config.json"] = generation.dump(2) + "\n";
    }
    for (const auto& [name, bytes] : files) write(name, bytes);
    fsync_dir(staging.string());
    for (const auto& entry : fs::directory_iterator(staging)) {
      const std::string name = entry.path().filename().string();
      const auto known = sha256.find(name);
      result.files.push_back(
          {name, known != sha256.end() ? known->second : sha256_file_hex(entry.path().string())});
      result.bytes += fs::file_size(entry.path());
    }
    std::sort(result.files.begin(), result.files.end());
    verified.get();
    exchange_into(staging.string(), out.string());
    fsync_dir(out.parent_path().string());
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  return result;
}

Json load_hf_vision_tower(const std::string& dir_name, GPT& model) {
  const fs::path dir = fs::absolute(dir_name).lexically_normal();
  if (!fs::exists(dir / "config.json"))
    fail(ExitCode::kUsage,
         "ckpt.init_vision_from = {}: no config.json there: give a Hugging Face SigLIP model "
         "directory",
         dir_name);
  const std::string config_path = (dir / "config.json").string();
  const Json config = read_json_file(dir / "config.json");
  const std::string type = config.is_object() ? config.value("model_type", "") : "";
  if (type != "siglip_vision_model" && type != "siglip")
    fail(ExitCode::kData,
         "{}: model_type = \"{}\": ckpt.init_vision_from reads a SiglipVisionModel or a "
         "SiglipModel",
         config_path, type);
  const bool whole_siglip = type == "siglip";
  const VisionSpec have =
      siglip_vision_spec(whole_siglip ? config.value("vision_config", Json::object()) : config,
                         config_path + (whole_siglip ? ": vision_config" : ""));
  const VisionSpec& want = model.config().vision;
  if (!want.enabled())
    fail(ExitCode::kUsage,
         "ckpt.init_vision_from is set, but the model has no vision tower (vision.layers = 0)");
  const auto same = [&](const char* key, auto mine, auto theirs) {
    if (mine != theirs)
      fail(ExitCode::kUsage,
           "vision.{} = {}, but the tower in {} has {}: set vision.{} = {} to start from it", key, mine,
           dir.string(), theirs, key, theirs);
  };
  same("layers", want.layers, have.layers);
  same("image_size", want.image_size, have.image_size);
  same("patch", want.patch, have.patch);
  same("width", want.width, have.width);
  same("heads", want.heads, have.heads);
  same("mlp_hidden", want.mlp_hidden, have.mlp_hidden);
  same("norm_eps", want.norm_eps, have.norm_eps);

  // The tower's tensors as LLaVA names them without "vision_tower.": SigLIP's own names.
  constexpr std::string_view kPrefix = "vision_tower.";
  std::map<std::string, HfTensor> wanted;
  for (HfTensor& t : hf_tensors(model.config()))
    if (model_part(t.param) == ModelPart::kVision) {
      t.name.erase(0, kPrefix.size());
      wanted.emplace(t.name, std::move(t));
    }
  std::map<std::string, std::string> index_map;
  const std::vector<Source> sources = open_weights(dir, index_map);
  // param -> (its published tensors, what each holds)
  std::map<std::string, std::vector<std::pair<const HfTensor*, const ckpt::SafeTensor*>>> by_param;
  std::set<std::string> found;
  Json files = Json::object();
  std::map<ckpt::DType, uint64_t> dtype_bytes;
  for (const Source& s : sources) {
    const std::string where = (dir / s.name).string();
    Sha256Stream sha;
    sha.update(s.file.header().data(), s.file.header().size());
    for (const ckpt::SafeTensor& t : s.file.tensors()) {
      sha.update(t.bytes.data(), t.bytes.size());
      // SiglipModel's text model, the pooling head, and the final norm of a model with post_norm off
      if (!t.name.starts_with("vision_model.") || t.name.starts_with("vision_model.head.") ||
          (!want.post_norm && t.name.starts_with("vision_model.post_layernorm.")))
        continue;
      const auto w = wanted.find(t.name);
      if (w == wanted.end())
        fail(ExitCode::kData, "{}: tensor '{}' is not part of the SigLIP tower config.json describes", where,
             t.name);
      if (t.shape != w->second.shape)
        fail(ExitCode::kData, "{}: tensor '{}' has shape {}, but config.json makes it {}", where, t.name,
             fmt::format("{}", t.shape), fmt::format("{}", w->second.shape));
      if (!found.insert(t.name).second) fail(ExitCode::kData, "{}: tensor '{}' appears twice", where, t.name);
      by_param[w->second.param].push_back({&w->second, &t});
      dtype_bytes[t.dtype] += t.bytes.size();
    }
    files[s.name] = sha.hex();
  }
  for (const auto& [name, t] : wanted)
    if (!found.count(name))
      fail(ExitCode::kData, "{}: tensor '{}' is missing (config.json describes a tower that has it)",
           dir.string(), name);

  load_params(
      model, [&](std::string_view param) { return by_param.count(std::string(param)) > 0; },
      [&](const ckpt::Slice& piece, float* out) {
        const std::vector<ckpt::Run> runs = ckpt::runs_of(piece.normalized());
        for (const auto& [m, t] : by_param.at(piece.name)) {
          ckpt::Slice published = ckpt::Slice::whole(piece.name, m->param_shape);
          published.offset = m->offset;
          published.count = m->count;
          ckpt::intersect_runs(runs, ckpt::runs_of(published.normalized()),
                               [&](int64_t lo, int64_t hi, int64_t at_piece, int64_t at_published) {
                                 for (int64_t i = 0; i < hi - lo; ++i)
                                   out[at_piece + i] = element(*t, at_published + i);
                               });
        }
      });
  Json origin = {{"format", "hf"},
                 {"source", dir.string()},
                 {"architecture", config.contains("architectures") ? config["architectures"][0] : Json(type)},
                 {"torch_dtype", torch_dtype_name(most_bytes(dtype_bytes))},
                 {"files", files}};
  identify(dir, config, origin);
  return origin;
}

}  // namespace forge::trainer
