// Spec validation: every inconsistent model config is a usage error naming the key, the rule and where it
// was set, before anything is allocated.
#include "forge/trainer/spec.h"
#include "forge/common/error.h"
#include "forge/trainer/checkpoint_io.h"
#include "support/temp_dir.h"

#include <catch2/catch.hpp>

#include <cstdlib>

using namespace forge::trainer;

namespace {

forge::Config load(const std::vector<std::string>& overrides, const std::string& path = "") {
  forge::ConfigSchema schema;
  add_trainer_keys(schema);
  return forge::load_config(schema, path, overrides);
}

std::string usage_error(const std::vector<std::string>& overrides) {
  try {
    train_spec(load(overrides));
  } catch (const forge::Error& e) {
    CHECK(e.code() == forge::ExitCode::kUsage);
    return e.what();
  }
  FAIL("accepted " << overrides.front());
  return "";
}

}  // namespace

TEST_CASE("a valid spec resolves", "[trainer][spec]") {
  const TrainSpec s = train_spec(load({"--model.layers=3", "--run.threads=2", "--precision.dtype=bf16"}));
  CHECK(s.model.layers == 3);
  CHECK(s.model.max_positions == s.model.seq_len);
  CHECK(s.threads == 2);
  CHECK(s.dtype == DType::kBF16);
  CHECK(s.data_order == "block");
  CHECK(train_spec(load({"--data.order=global"})).data_order == "global");
}

TEST_CASE("run.objective: every objective of the table resolves to its own traits and loss",
          "[trainer][spec]") {
  for (const ObjectiveTraits& t : objectives()) {
    CAPTURE(t.name);
    std::vector<std::string> keys = {"--run.objective=" + std::string(t.name)};
    if (t.companion == Companion::kTeacher) keys.push_back("--distill.teacher=/nowhere");
    const TrainSpec s = train_spec(load(keys));
    CHECK(s.objective == t.objective);
    CHECK(&traits(s.objective) == &t);
    CHECK(find_objective(t.name) == &t);
    // Fine-tuning objectives mask documents whatever data.document_mask says: a reply sees its prompt only.
    CHECK(s.document_mask == (t.scored == Scored::kReplies));
    CHECK(objective_loss(s)->name() == (t.objective == Objective::kSft ? "lm" : std::string(t.name)));
    if (!t.splits_over_context)
      CHECK_THAT(usage_error({keys[0], keys.size() > 1 ? keys[1] : "--run.seed=1", "--parallel.cp=2"}),
                 Catch::Contains("run.objective = " + std::string(t.name)));
  }
  CHECK(find_objective("reinforce") == nullptr);
  CHECK_THAT(usage_error({"--run.objective=reinforce"}), Catch::Contains("run.objective"));
  // Which positions are scored, by dataset format.
  CHECK_FALSE(scores_replies(traits(Objective::kLm), "chat"));
  CHECK(scores_replies(traits(Objective::kSft), "chat"));
  CHECK(scores_replies(traits(Objective::kDistill), "chat"));
  CHECK_FALSE(scores_replies(traits(Objective::kDistill), "text"));
  CHECK(reads_format(traits(Objective::kLm), "preference"));
  CHECK_FALSE(reads_format(traits(Objective::kDistill), "preference"));
  CHECK_FALSE(reads_format(traits(Objective::kDpo), "chat"));
}

TEST_CASE("run.objective = ppo: a value head, its keys PPO's alone", "[trainer][spec][ppo]") {
  const TrainSpec ppo = train_spec(load({"--run.objective=ppo", "--rl.group_size=1", "--rl.lambda=0.9"}));
  CHECK(ppo.model.value_head);
  CHECK(ppo.rl.group_size == 1);
  CHECK(ppo.rl.ppo.lambda == 0.9);
  CHECK(model_spec_json(ppo.model).at("value_head") == "on");
  CHECK(model_spec_from_json(model_spec_json(ppo.model), "here").value_head);
  const TrainSpec grpo = train_spec(load({"--run.objective=grpo"}));
  CHECK_FALSE(grpo.model.value_head);
  CHECK_FALSE(model_spec_json(grpo.model).contains("value_head"));
  for (const char* key : {"--rl.gamma=0.99", "--rl.lambda=0.9", "--rl.value_coef=1", "--rl.value_clip=0.5"})
    CHECK_THAT(usage_error({"--run.objective=grpo", key}),
               Catch::Contains(std::string(key).substr(2, std::string(key).find('=') - 2)) &&
                   Catch::Contains("PPO's value head"));
  CHECK_THAT(usage_error({"--run.objective=grpo", "--model.value_head=on"}),
             Catch::Contains("model.value_head") && Catch::Contains("only run.objective = ppo"));
  CHECK_THAT(usage_error({"--run.objective=ppo", "--model.value_head=off"}),
             Catch::Contains("model.value_head"));
  CHECK_THAT(usage_error({"--run.objective=grpo", "--rl.group_size=1"}), Catch::Contains("rl.group_size"));
  CHECK_THAT(usage_error({"--run.objective=ppo", "--rl.gamma=1.5"}), Catch::Contains("rl.gamma"));
  CHECK_THAT(usage_error({"--run.objective=ppo", "--rl.value_clip=0"}), Catch::Contains("rl.value_clip"));
}

TEST_CASE("inconsistent model configs are rejected naming key and rule", "[trainer][spec]") {
  CHECK_THAT(usage_error({"--model.d_model=100", "--model.heads=3"}),
             Catch::Contains("model.d_model = 100") && Catch::Contains("divisible by model.heads = 3"));
  CHECK_THAT(usage_error({"--model.seq_len=512", "--model.max_positions=256"}),
             Catch::Contains("model.seq_len") && Catch::Contains("max_positions = 256"));
  CHECK_THAT(usage_error({"--model.layers=0"}), Catch::Contains("model.layers = 0"));
  CHECK_THAT(usage_error({"--model.vocab=-5"}), Catch::Contains("model.vocab = -5"));
  CHECK_THAT(usage_error({"--data.batch=0"}), Catch::Contains("data.batch"));
  CHECK_THAT(usage_error({"--data.order=random"}),
             Catch::Contains("data.order = random") && Catch::Contains("block or global"));
  CHECK_THAT(usage_error({"--parallel.tp=4"}),
             Catch::Contains("parallel.tp = 4") && Catch::Contains("must divide model.heads"));
  CHECK_THAT(usage_error({"--optim.min_lr=1", "--optim.lr=0.1"}), Catch::Contains("optim.min_lr"));
  CHECK_THAT(usage_error({"--optim.beta2=1"}), Catch::Contains("optim.beta2"));
}

TEST_CASE("model families: presets, slot keys and the rules between them", "[trainer][spec]") {
  const ModelSpec llama =
      train_spec(load({"--model.family=llama", "--model.heads=6", "--model.kv_heads=2"})).model;
  CHECK(llama.family == Family::kLlama);
  CHECK(llama.norm == Norm::kRmsNorm);
  CHECK(llama.activation == Activation::kSwiglu);
  CHECK(llama.positions == Positions::kRotary);
  CHECK(llama.rope.theta == 5e5);
  CHECK_FALSE(llama.tied_embeddings);
  CHECK_FALSE(llama.linear_bias);
  CHECK(llama.kv_heads == 2);
  CHECK(llama.head_dim == 384 / 6);
  CHECK(llama.ffn_hidden == 1024);  // 8/3 x 384, rounded up to a multiple of 64
  // Any slot key overrides the family's value.
  const ModelSpec qwen3 =
      train_spec(load({"--model.family=qwen3", "--model.head_dim=128", "--model.tied_embeddings=on"})).model;
  CHECK(qwen3.qk_norm);
  CHECK(qwen3.head_dim == 128);
  CHECK(qwen3.tied_embeddings);
  CHECK(qwen3.norm_eps == 1e-6f);
  const ModelSpec mixtral = train_spec(load({"--model.family=mixtral", "--model.experts=8"})).model;
  CHECK(mixtral.ffn == Ffn::kMoe);
  CHECK(mixtral.router_renormalize);
  CHECK(mixtral.moe_hidden == mixtral.ffn_hidden);
  const ModelSpec qwen_moe =
      train_spec(load({"--model.family=qwen2_moe", "--model.experts=4", "--model.moe_hidden=64"})).model;
  CHECK_FALSE(qwen_moe.router_renormalize);
  CHECK(qwen_moe.shared_expert_hidden == 256);
  CHECK(qwen_moe.qkv_bias);
  // gpt2 is what a spec without model.family always was.
  const ModelSpec gpt2 = train_spec(load({})).model;
  CHECK(gpt2.family == Family::kGpt2);
  CHECK(gpt2.norm == Norm::kLayerNorm);
  CHECK(gpt2.ffn_hidden == 4 * gpt2.d_model);
  CHECK(gpt2.tied_embeddings);

  CHECK_THAT(
      usage_error({"--model.family=llama", "--model.heads=8", "--model.d_model=512", "--model.kv_heads=3"}),
      Catch::Contains("model.kv_heads = 3") && Catch::Contains("must divide model.heads = 8") &&
          Catch::Contains("1, 2, 4, 8"));
  CHECK_THAT(usage_error({"--model.family=gpt3"}),
             Catch::Contains("model.family") && Catch::Contains("llama"));
  CHECK_THAT(usage_error({"--model.norm=batchnorm"}),
             Catch::Contains("model.norm") && Catch::Contains("rmsnorm"));
  CHECK_THAT(usage_error({"--model.family=llama", "--model.heads=4", "--model.head_dim=7"}),
             Catch::Contains("model.head_dim = 7") && Catch::Contains("rotary"));
  CHECK_THAT(usage_error({"--model.kv_heads=2"}),
             Catch::Contains("model.kv_heads") && Catch::Contains("gpt2 family") && Catch::Contains("llama"));
  CHECK_THAT(usage_error({"--model.family=llama", "--model.heads=12", "--model.d_model=768",
                          "--model.kv_heads=4", "--parallel.tp=6"}),
             Catch::Contains("parallel.tp = 6") && Catch::Contains("model.kv_heads = 4"));
  // Fewer key/value heads than ranks: each is held by tp / kv_heads ranks.
  CHECK(train_spec(load({"--model.family=llama", "--model.heads=8", "--model.d_model=512",
                         "--model.kv_heads=2", "--parallel.tp=4"}))
            .layout.tp == 4);
  CHECK_THAT(
      usage_error({"--model.family=llama", "--model.heads=4", "--model.ffn_hidden=102", "--parallel.tp=4"}),
      Catch::Contains("parallel.tp = 4") && Catch::Contains("model.ffn_hidden = 102"));
  // Every block MoE: the dense width is unused and need not split.
  CHECK(train_spec(
            load({"--model.family=mixtral", "--model.heads=8", "--model.d_model=512", "--model.experts=4",
                  "--model.ffn_hidden=102", "--model.moe_hidden=128", "--parallel.tp=4"}))
            .model.ffn_hidden == 102);
}

TEST_CASE("parallel layouts that cannot work are rejected naming the rule", "[trainer][spec]") {
  CHECK_NOTHROW(
      train_spec(load({"--parallel.tp=2", "--parallel.pp=2", "--parallel.dp=2", "--parallel.zero=1"})));
  CHECK_THAT(usage_error({"--parallel.tp=2", "--model.vocab=8191"}),
             Catch::Contains("must divide model.vocab"));
  CHECK_THAT(usage_error({"--model.layers=2", "--parallel.pp=3"}), Catch::Contains("at least one block"));
  CHECK_THAT(usage_error({"--parallel.zero=4"}), Catch::Contains("must be 0, 1, 2 or 3"));
  CHECK_NOTHROW(train_spec(load({"--parallel.dp=2", "--parallel.zero=3", "--run.device=cpu"})));
  CHECK_NOTHROW(train_spec(
      load({"--parallel.dp=2", "--parallel.zero=3", "--run.device=cpu", "--precision.dtype=bf16"})));
  CHECK_NOTHROW(train_spec(load({"--parallel.dp=2", "--parallel.zero=2", "--run.device=cuda"})));
  CHECK_THAT(usage_error({"--parallel.pp=2", "--parallel.stage_layers=1,2"}),
             Catch::Contains("adds up to 3"));
  CHECK_THAT(usage_error({"--parallel.pp=2", "--parallel.stage_layers=2"}),
             Catch::Contains("lists 1 stages"));
  CHECK_THAT(usage_error({"--parallel.stage_layers=x"}), Catch::Contains("comma-separated"));
  const TrainSpec s =
      train_spec(load({"--model.layers=5", "--parallel.pp=2", "--parallel.stage_layers=2,3"}));
  CHECK(s.parallel.stage_layers == std::vector<int>{2, 3});
}

TEST_CASE("pipeline schedules: names, model chunks and what they cannot serve are checked",
          "[trainer][spec]") {
  const TrainSpec s = train_spec(load({"--model.layers=8", "--parallel.pp=2", "--parallel.microbatches=4",
                                       "--parallel.pp_schedule=interleaved"}));
  CHECK(s.parallel.pp_schedule == PipeScheduleKind::kInterleaved);
  CHECK(s.parallel.pp_virtual == 2);  // 0: two chunks a stage
  CHECK(train_spec(load({"--parallel.pp=2", "--parallel.pp_schedule=zb-h1"})).parallel.pp_virtual == 1);
  CHECK_THAT(usage_error({"--parallel.pp_schedule=gpipe"}),
             Catch::Contains("parallel.pp_schedule") && Catch::Contains("1f1b, interleaved or zb-h1"));
  CHECK_THAT(usage_error({"--model.layers=8", "--parallel.pp=2", "--parallel.microbatches=4",
                          "--parallel.pp_schedule=interleaved", "--parallel.pp_virtual=3"}),
             Catch::Contains("parallel.pp_virtual") && Catch::Contains("pp_virtual = 3: does not divide") &&
                 Catch::Contains("= 6 equal model chunks"));
  CHECK_THAT(usage_error({"--model.layers=8", "--parallel.pp=2", "--parallel.microbatches=3",
                          "--parallel.pp_schedule=interleaved"}),
             Catch::Contains("parallel.microbatches") && Catch::Contains("multiple of 2"));
  CHECK_THAT(usage_error({"--parallel.pp_schedule=interleaved"}), Catch::Contains("parallel.pp is 1"));
  CHECK_THAT(usage_error({"--parallel.pp=2", "--parallel.pp_virtual=2"}),
             Catch::Contains("parallel.pp_virtual") && Catch::Contains("the schedule is 1f1b"));
  CHECK_THAT(usage_error({"--model.layers=8", "--parallel.pp=2", "--parallel.microbatches=2",
                          "--parallel.pp_schedule=interleaved", "--parallel.stage_layers=3,5"}),
             Catch::Contains("parallel.stage_layers") && Catch::Contains("equal model chunks"));
  CHECK_THAT(usage_error({"--parallel.pp=2", "--parallel.dp=2", "--parallel.zero=3",
                          "--parallel.pp_schedule=zb-h1", "--parallel.reduce_each_microbatch=true"}),
             Catch::Contains("parallel.reduce_each_microbatch") && Catch::Contains("zb-h1"));
}

TEST_CASE("errors cite the file and line of the offending key", "[trainer][spec]") {
  forge::test::TempDir dir;
  const std::string path = dir.write("job.ini", "[model]\nlayers = 2\nd_model = 100\nheads = 3\n");
  try {
    train_spec(load({}, path));
    FAIL("accepted");
  } catch (const forge::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains(path + ":3"));
  }
}

TEST_CASE("threads come from the spec, SLURM_CPUS_PER_TASK, or the machine", "[trainer][spec]") {
  CHECK(resolve_threads(3) == 3);
  ::setenv("SLURM_CPUS_PER_TASK", "5", 1);
  CHECK(resolve_threads(0) == 5);
  ::setenv("SLURM_CPUS_PER_TASK", "five", 1);
  CHECK_THROWS_AS(resolve_threads(0), forge::Error);
  ::unsetenv("SLURM_CPUS_PER_TASK");
  CHECK(resolve_threads(0) >= 1);
  // A step without --cpus-per-task: the node's CPUs over its tasks (node 1 of "4(x2),2" holds 4).
  ::setenv("SLURM_CPUS_ON_NODE", "8", 1);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2),2", 1);
  ::setenv("SLURM_NODEID", "1", 1);
  CHECK(resolve_threads(0) == 2);
  ::setenv("SLURM_NODEID", "2", 1);
  CHECK(resolve_threads(0) == 4);
  ::setenv("SLURM_STEP_TASKS_PER_NODE", "16", 1);  // more tasks than CPUs: one each
  ::setenv("SLURM_NODEID", "0", 1);
  CHECK(resolve_threads(0) == 1);
  for (const char* v : {"SLURM_CPUS_ON_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"}) ::unsetenv(v);
}

TEST_CASE("run.trace_steps: a range inside the run, one step, or auto after this process's first",
          "[trainer][spec]") {
  const auto window = [](const std::string& v, int64_t done) {
    const TraceSteps w =
        train_spec(load({"--run.steps=10", "--run.trace_steps=" + v})).trace.window(done, 10);
    return std::pair{w.first, w.last};
  };
  CHECK(window("3-5", 0) == std::pair<int64_t, int64_t>{3, 5});
  CHECK(window("3-5", 3) == std::pair<int64_t, int64_t>{4, 5});  // resumed inside the window: the rest
  CHECK(window("3-5", 5) == std::pair<int64_t, int64_t>{0, 0});  // resumed past it: nothing
  CHECK(window("7", 0) == std::pair<int64_t, int64_t>{7, 7});
  CHECK(window("auto", 0) == std::pair<int64_t, int64_t>{2, 4});
  CHECK(window("auto", 6) == std::pair<int64_t, int64_t>{8, 10});
  CHECK(window("auto", 8) == std::pair<int64_t, int64_t>{10, 10});
  CHECK(window("auto", 10) == std::pair<int64_t, int64_t>{0, 0});
  CHECK(train_spec(load({})).trace.window(0, 100).first == 0);  // off by default
  for (const char* bad : {"5-11", "0-2", "4-3", "x-2", "3-", "-3", "3-5-7"})
    CHECK_THAT(usage_error({"--run.steps=10", std::string("--run.trace_steps=") + bad}),
               Catch::Contains("run.trace_steps") && Catch::Contains("run.steps = 10"));
}

TEST_CASE("run.device, parallel.comm and precision.dtype = auto resolve from the GPUs a process sees",
          "[trainer][spec][device]") {
  SECTION("auto without a GPU: cpu, mpi, fp32, as before the keys existed") {
    TrainSpec s = train_spec(load({}));
    CHECK(s.device == Device::kAuto);
    CHECK(s.dtype_auto);
    resolve_device(s, 0, "no NVIDIA driver");
    CHECK(s.device == Device::kCpu);
    CHECK(s.parallel.comm == CommKind::kMpi);
    CHECK(s.dtype == DType::kF32);
  }
  SECTION("auto with a GPU: cuda, nccl, bf16") {
    TrainSpec s = train_spec(load({}));
    resolve_device(s, 1, "");
    CHECK(s.device == Device::kCuda);
    CHECK(s.parallel.comm == CommKind::kNccl);
    CHECK(s.dtype == DType::kBF16);
  }
  SECTION("explicit values stay: fp32 on cuda over host-staged mpi") {
    TrainSpec s = train_spec(load({"--run.device=cuda", "--precision.dtype=fp32", "--parallel.comm=mpi"}));
    resolve_device(s, 2, "");
    CHECK(s.device == Device::kCuda);
    CHECK(s.parallel.comm == CommKind::kMpi);
    CHECK(s.dtype == DType::kF32);
  }
  SECTION("cuda without a GPU is a usage error that says why and what to change") {
    TrainSpec s = train_spec(load({"--run.device=cuda"}));
    try {
      resolve_device(s, 0, "CUDA driver version is insufficient");
      FAIL("accepted run.device = cuda without a GPU");
    } catch (const forge::Error& e) {
      CHECK(e.code() == forge::ExitCode::kUsage);
      CHECK_THAT(e.what(), Catch::Contains("run.device = cuda, but CUDA driver version is insufficient") &&
                               Catch::Contains("set run.device = cpu or auto"));
    }
  }
  SECTION("nccl needs a GPU") {
    CHECK_THAT(usage_error({"--run.device=cpu", "--parallel.comm=nccl"}),
               Catch::Contains("parallel.comm") && Catch::Contains("needs mpi"));
    TrainSpec s = train_spec(load({"--parallel.comm=nccl"}));
    CHECK_THROWS_WITH(resolve_device(s, 0, "none"),
                      Catch::Contains("parallel.comm = nccl, but run.device = auto chose cpu"));
  }
}
