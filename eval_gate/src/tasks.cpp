#include "forge/eval_gate/tasks.h"

#include "forge/common/error.h"
#include "forge/common/hash.h"
#include "forge/common/progress_line.h"
#include "forge/common/text.h"
#include "forge/dataio/image.h"
#include "forge/dataio/image_text.h"
#include "forge/eval_gate/cider.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>

namespace forge::gate {
namespace {

constexpr int kExamples = 4;           // tasks shown in the verdict per suite
constexpr size_t kExampleBytes = 240;  // of a prompt or an output

// The draws of sample `sample` of task `id`: the same on whichever rank the task lands.
uint64_t request_key(const std::string& id, int sample) {
  return xxh3_64(id.data(), id.size(), uint64_t(sample));
}

// A chat suite's prompt is the user's turn of a conversation that the assistant answers next.
std::vector<int32_t> prompt_tokens(const Suite& suite, const PromptFormat& f, const std::string& prompt) {
  if (!suite.chat) return f.text_prompt(prompt);
  const data::ChatMessage user{data::ChatRole::kUser, prompt};
  return f.chat_prompt(std::span(&user, 1));
}

// A task's picture in its prompt: the placeholder (`id`) expanded into the picture's run of the tower's
// positions, the picture decoded and fitted as prepare fits the data (pad, docs/DATA.md) into `rgb`.
// Returns where the run starts.
size_t place_picture(const Suite& suite, const Task& task, const trainer::VisionSpec& vision, uint32_t id,
                     std::vector<int32_t>& prompt, std::vector<uint8_t>& rgb) {
  std::vector<uint32_t> ids(prompt.begin(), prompt.end());
  std::vector<uint8_t> no_mask;
  const std::vector<uint64_t> runs = data::expand_image_tokens(ids, no_mask, id, uint32_t(vision.tokens()));
  if (runs.size() != 1)
    fail(ExitCode::kData,
         "suite {}: task \"{}\": its prompt holds {} placeholder tokens once formatted; it needs one",
         suite.name, task.id, runs.size());
  prompt.assign(ids.begin(), ids.end());
  const std::string bytes = read_file(task.image);
  // Decoded for the fit as prepare decodes training pictures (a large JPEG reduced by DCT scaling).
  const data::Reduce reduce{uint32_t(vision.image_size), data::ImageFit::kPad};
  const data::DecodeResult d = data::decode_image(
      {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}, data::kMaxPixels, reduce);
  if (!d.reason.empty())
    fail(ExitCode::kData, "suite {}: task \"{}\": picture {} is {} ({}); replace it", suite.name, task.id,
         task.image, d.reason, d.detail);
  rgb = data::fit_image(d.image, reduce.size, reduce.fit).rgb;
  return size_t(runs[0]);
}

// Sum of log p(continuation | context) under the model: the two sequences run through one cache slot
// together (the context's last max_positions - |continuation| tokens when too long; a context with a
// picture, whose run that would cut or drop, is refused instead).
double log_likelihood(trainer::GPT& model, trainer::KvCache& cache, std::vector<int32_t> context,
                      const std::vector<int32_t>& continuation,
                      std::span<const trainer::DecodePicture> pictures = {}) {
  const int max_len = cache.max_len(), V = model.config().vocab;
  const size_t room = size_t(max_len) - std::min(continuation.size(), size_t(max_len) - 1);
  if (context.size() > room && !pictures.empty())
    fail(ExitCode::kData,
         "a prompt with a picture and its choice are {} tokens, more than the model's {} positions: shorten "
         "the prompt or the choice",
         context.size() + continuation.size(), max_len);
  if (context.size() > room) context.erase(context.begin(), context.end() - ptrdiff_t(room));
  std::vector<int32_t> seq = context;
  seq.insert(seq.end(), continuation.begin(), continuation.end());
  seq.resize(std::min(seq.size(), size_t(max_len)));
  std::vector<trainer::DecodeRow> rows;
  for (size_t i = 0; i < seq.size(); ++i) rows.push_back({0, int32_t(i), seq[i]});
  // The rows whose logits predict the continuation's tokens.
  std::vector<int> wanted;
  for (size_t i = context.size(); i < seq.size(); ++i) wanted.push_back(int(i) - 1);
  std::vector<float> logits(wanted.size() * size_t(V));
  model.decode(cache, rows, wanted, logits, pictures);
  double total = 0;
  for (size_t j = 0; j < wanted.size(); ++j) {
    const std::span<const float> row(logits.data() + j * size_t(V), size_t(V));
    const double top = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (float x : row) sum += std::exp(double(x) - top);
    total += double(row[size_t(seq[context.size() + j])]) - top - std::log(sum);
  }
  return total;
}

// The code of a chat reply: its first fenced block (without the fence's language tag), else all of it.
std::string fenced_code(const std::string& reply) {
  const size_t open = reply.find("```");
  if (open == std::string::npos) return reply;
  const size_t body = reply.find('\n', open);
  if (body == std::string::npos) return reply;
  const size_t close = reply.find("```", body + 1);
  return reply.substr(body + 1, close == std::string::npos ? std::string::npos : close - body - 1);
}

}  // namespace

double SuiteMetric::value() const {
  if (per_task.empty()) return NAN;
  double sum = 0;
  for (const auto& [_, v] : per_task) sum += v;
  return sum / double(per_task.size());
}

Interval SuiteMetric::interval(double confidence) const {
  std::vector<double> x;
  for (const auto& [_, v] : per_task) x.push_back(v);
  if (rate) {
    double s = 0;
    for (double v : x) s += v;
    return wilson(s, double(x.size()), confidence);
  }
  return bootstrap_mean(x, confidence, kBootstrapResamples, kBootstrapSeed);
}

Json SuiteMetric::to_json(double confidence) const {
  const Interval ci = interval(confidence);
  Json tasks = Json::object();
  for (const auto& [id, v] : per_task) tasks[id] = v;
  return {{"value", value()},
          {"lo", ci.lo},
          {"hi", ci.hi},
          {"n", per_task.size()},
          {"interval", rate ? "wilson" : "bootstrap"},
          {"confidence", confidence},
          {"per_task", tasks}};
}

SuiteMetric SuiteMetric::from_json(const Json& j) {
  SuiteMetric m;
  m.rate = j.at("interval").get<std::string>() == "wilson";
  for (const auto& [id, v] : j.at("per_task").items()) m.per_task[id] = v.get<double>();
  return m;
}

std::vector<std::string> suite_metrics(const Suite& suite) {
  switch (suite.type) {
    case SuiteType::kExactMatch:
    case SuiteType::kVqa:
      return {"accuracy"};
    case SuiteType::kMultipleChoice:
      return {"accuracy", "accuracy_raw"};
    case SuiteType::kCode: {
      std::vector<std::string> out;
      for (int k : suite.generation.pass_at) out.push_back("pass@" + std::to_string(k));
      return out;
    }
    case SuiteType::kRefusal:
      return {"refusal_rate", "over_refusal_rate"};
    case SuiteType::kCaption:
      return {"cider_d"};
  }
  return {};
}

Json SuiteResult::to_json(double confidence) const {
  Json m = Json::object();
  for (const auto& [name, metric] : metrics) m[name] = metric.to_json(confidence);
  return {{"name", this->name},
          {"type", type},
          {"version", version},
          {"tasks", tasks},
          {"metrics", m},
          {"generation",
           {{"sequences", generation.sequences},
            {"prompt_tokens", generation.prompt_tokens},
            {"new_tokens", generation.new_tokens},
            {"seconds", generation.seconds},
            {"tokens_per_second", generation.tokens_per_second()}}},
          {"examples", examples}};
}

SuiteResult SuiteResult::from_json(const Json& j) {
  SuiteResult r;
  r.name = j.at("name").get<std::string>();
  r.type = j.at("type").get<std::string>();
  r.version = j.at("version").get<std::string>();
  r.tasks = j.at("tasks").get<int64_t>();
  for (const auto& [name, m] : j.at("metrics").items()) r.metrics[name] = SuiteMetric::from_json(m);
  return r;
}

std::string code_program(const Suite& suite, const Task& task, const std::string& completion,
                         const std::string& sentinel) {
  std::string program = suite.chat ? fenced_code(completion) : task.prompt + completion;
  program += "\n\n" + task.tests + "\n";
  if (!task.entry_point.empty()) program += "\ncheck(" + task.entry_point + ")\n";
  return program + "\nprint(\"" + sentinel + "\")\n";
}

bool code_passed(const SandboxResult& result, const std::string& sentinel) {
  const std::string tail = sentinel + "\n";
  return result.passed() && !result.output_truncated && result.output.size() >= tail.size() &&
         result.output.compare(result.output.size() - tail.size(), tail.size(), tail) == 0;
}

SuiteResult run_suite(const Suite& suite, trainer::GPT& model, const PromptFormat& format,
                      const SuiteRunOptions& options, comm::Comm& comm) {
  if (suite.chat && !format.can_chat())
    fail(
        ExitCode::kUsage,
        "suite {} ({}) is a chat suite but the tokenizer has no chat markers and the model no chat template: "
        "evaluate a model trained with a chat-capable tokenizer or one with its own template, or set "
        "\"format\": \"text\" in its suite.json",
        suite.name, suite.dir);
  const int rank = comm.rank(), world = comm.size();
  const data::Tokenizer& tok = *format.tokenizer;
  if (tok.vocab_size() > uint32_t(model.config().vocab))
    fail(ExitCode::kUsage,
         "suite {}: the tokenizer has {} tokens but the model's vocabulary is {}: evaluate with the dataset "
         "the "
         "model was trained on",
         suite.name, tok.vocab_size(), model.config().vocab);
  const trainer::VisionSpec& vision = model.config().vision;
  const bool pictures =
      std::any_of(suite.tasks.begin(), suite.tasks.end(), [](const Task& t) { return !t.image.empty(); });
  if (pictures && !vision.enabled())
    fail(ExitCode::kUsage,
         "suite {} ({}) asks about pictures, and the model has no vision tower: evaluate a vision-language "
         "model, or leave the suite out of the policy",
         suite.name, suite.dir);
  const std::vector<std::string> names = suite_metrics(suite);
  const size_t n_tasks = suite.size(), M = names.size();
  // Per metric and task: the score and whether the metric applies to the task; each task on one rank.
  std::vector<double> score(2 * M * n_tasks, 0.0);
  const auto set = [&](size_t metric, size_t task, double v) {
    score[metric * n_tasks + task] = v;
    score[(M + metric) * n_tasks + task] = 1;
  };
  std::vector<size_t> mine;
  for (size_t i = size_t(rank); i < n_tasks; i += size_t(world)) mine.push_back(i);
  SuiteResult out;
  out.name = suite.name;
  out.type = suite_type_name(suite.type);
  out.version = suite.version;
  out.tasks = int64_t(n_tasks);
  const auto example = [&](size_t task, const std::string& output, double s) {
    if (rank == 0 && out.examples.size() < size_t(kExamples))
      out.examples.push_back({{"id", suite.tasks[task].id},
                              {"prompt", printable(suite.tasks[task].prompt, kExampleBytes, true)},
                              {"output", printable(output, kExampleBytes, true)},
                              {"score", s}});
  };
  std::optional<ProgressLine> progress;
  if (rank == 0) progress.emplace("suite " + suite.name, "tasks", mine.size());

  const uint32_t image_id = pictures ? data::image_token_id(*format.tokenizer, format.tokenizer_path) : 0;
  if (suite.type == SuiteType::kMultipleChoice) {
    trainer::KvCache cache(model, 1, model.config().max_positions);
    for (size_t i : mine) {
      const Task& task = suite.tasks[i];
      std::vector<int32_t> context = prompt_tokens(suite, format, task.prompt);
      std::vector<uint8_t> rgb;
      std::vector<trainer::DecodePicture> picture;
      if (!task.image.empty())
        picture.push_back({int(place_picture(suite, task, vision, image_id, context, rgb)), nullptr});
      if (!picture.empty()) picture[0].rgb = rgb.data();
      // Raw: the summed log-likelihood; normalised: per byte of the choice (longer choices are not
      // penalised for their length). The first of equals wins.
      int best_raw = 0, best_norm = 0;
      double top_raw = -INFINITY, top_norm = -INFINITY;
      for (size_t c = 0; c < task.choices.size(); ++c) {
        const double ll = log_likelihood(model, cache, context, format.encode(task.choices[c]), picture);
        const double norm = ll / double(std::max<size_t>(task.choices[c].size(), 1));
        if (ll > top_raw) top_raw = ll, best_raw = int(c);
        if (norm > top_norm) top_norm = norm, best_norm = int(c);
      }
      set(0, i, best_norm == task.answer ? 1 : 0);
      set(1, i, best_raw == task.answer ? 1 : 0);
      example(i, task.choices[size_t(best_norm)], best_norm == task.answer ? 1 : 0);
      if (progress) progress->add(1);
    }
  } else {
    const GenerationSettings& g = suite.generation;
    Sampling sampling;
    sampling.temperature = g.temperature;
    sampling.top_k = g.top_k;
    sampling.top_p = g.top_p;
    sampling.max_new_tokens = g.max_new_tokens;
    sampling.seed = g.seed;
    const Stops stops = format.stops(suite.chat);
    format.set_stops(stops, sampling);
    std::vector<Request> requests;
    std::vector<std::vector<uint8_t>> rgb(mine.size());  // each task's picture, fitted
    for (size_t j = 0; j < mine.size(); ++j) {
      const Task& task = suite.tasks[mine[j]];
      Request request{prompt_tokens(suite, format, task.prompt), 0, {}};
      if (!task.image.empty())
        request.pictures.push_back(
            {place_picture(suite, task, vision, image_id, request.prompt, rgb[j]), rgb[j].data()});
      for (int s = 0; s < g.samples; ++s) {
        request.key = request_key(task.id, s);
        requests.push_back(request);
      }
    }
    Generator generator(model, options.batch);
    const std::vector<Generation> generated = generator.run(requests, sampling);
    std::random_device entropy;
    const std::string sentinel = fmt::format("forge-tests-passed-{:08x}{:08x}", entropy(), entropy());
    out.generation = generator.stats();
    // Captions are scored against every task's references: the n-grams' document frequencies are the
    // suite's, whichever rank scores a task.
    std::optional<CiderD> cider;
    if (suite.type == SuiteType::kCaption) {
      std::vector<std::vector<Words>> corpus;
      for (const Task& t : suite.tasks) {
        corpus.emplace_back();
        for (const std::string& r : t.references) corpus.back().push_back(caption_words(r));
      }
      cider.emplace(corpus);
    }
    for (size_t j = 0; j < mine.size(); ++j) {
      const size_t i = mine[j];
      const Task& task = suite.tasks[i];
      int passed = 0;
      double cider_sum = 0;
      std::string first;
      for (int s = 0; s < g.samples; ++s) {
        const std::string text =
            format.completion(generated[j * size_t(g.samples) + size_t(s)].tokens, stops);
        if (s == 0) first = text;
        switch (suite.type) {
          case SuiteType::kExactMatch:
          case SuiteType::kVqa:
            passed += exact_match(text, task.answers) ? 1 : 0;
            break;
          case SuiteType::kRefusal:
            passed += is_refusal(text) ? 1 : 0;
            break;
          case SuiteType::kCaption: {
            std::vector<Words> refs;
            for (const std::string& r : task.references) refs.push_back(caption_words(r));
            cider_sum += cider->score(caption_words(text), refs);
            break;
          }
          case SuiteType::kCode: {
            const SandboxResult r =
                run_sandboxed({options.python, "-I", "solution.py"},
                              {{"solution.py", code_program(suite, task, text, sentinel)}},
                              options.scratch_parent, options.sandbox);
            spdlog::debug("suite {} task {} sample {}: {}", suite.name, task.id, s, r.describe());
            passed += code_passed(r, sentinel) ? 1 : 0;
            break;
          }
          case SuiteType::kMultipleChoice:
            break;
        }
      }
      const double share =
          (suite.type == SuiteType::kCaption ? cider_sum : double(passed)) / double(g.samples);
      if (suite.type == SuiteType::kCode) {
        for (size_t k = 0; k < M; ++k) set(k, i, pass_at_k(g.samples, passed, g.pass_at[k]));
      } else if (suite.type == SuiteType::kRefusal) {
        set(task.should_refuse ? 0 : 1, i, share);  // refused, among the prompts of its class
      } else {
        set(0, i, share);
      }
      example(i, first, share);
      if (progress) progress->add(1);
    }
  }
  if (progress) progress->finish();
  comm.all_reduce(score.data(), score.size(), comm::CommType::kF64, comm::ReduceOp::kSum)->wait();
  const bool rate = suite.generation.samples == 1 && suite.type != SuiteType::kCaption;
  for (size_t m = 0; m < M; ++m) {
    SuiteMetric& metric = out.metrics[names[m]];
    metric.rate = rate;
    for (size_t i = 0; i < n_tasks; ++i)
      if (score[(M + m) * n_tasks + i] > 0) metric.per_task[suite.tasks[i].id] = score[m * n_tasks + i];
  }
  return out;
}

}  // namespace forge::gate
