// The mnist_mt executable as a user runs it: bad flags exit 2 with one line naming the
// flag (and a number as it was typed), a run on a small data set writes its metrics, an injected fault exits 3 with
// the rank and step, and nothing hangs (every run has a deadline).
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_runner.hpp"

namespace {

using namespace cli_test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

const std::string kTf32OnGpus =
    "--precision: tf32 runs on GPUs only (a tensor-core format; CPU devices have none); use fp32, or --gpus LIST";

TEST(Cli, HelpListsTheFlagsButNotTheTestHook) {
  const Outcome o = run_cli({"--help"});
  EXPECT_EQ(o.exit_code, 0);
  for (const char* flag : {"--cpu", "--gpus", "--mode", "--epochs", "--batch-size", "--lr", "--momentum",
                           "--weight-decay", "--seed", "--bucket-mb", "--data", "--save", "--load", "--metrics",
                           "--save-every", "--keep", "--timeout", "--on-nan", "--trace", "--trace-steps",
                           "--phase-times", "--no-pin"}) {
    EXPECT_NE(o.out.find(flag), std::string::npos) << flag;
  }
  EXPECT_EQ(o.out.find("--inject-fault"), std::string::npos);
  EXPECT_EQ(o.out.find("--inject-stall"), std::string::npos);
  EXPECT_EQ(o.out.find("--inject-nan"), std::string::npos);
}

TEST(Cli, BadValuesExit2WithOneLineNamingTheFlag) {
  const std::string data = small_data().string();
  struct Case {
    std::vector<std::string> args;
    std::string flag;
    std::string says = "";  // the whole message, when given: a value as it was typed
  };
  const std::string kSeed = "--seed: must be a whole number from 0 to 18446744073709551615, got ";
  const std::vector<Case> cases = {
      {{"--gpus", "0,0"}, "--gpus"},
      {{"--gpus", "4096"}, "--gpus"},
      {{"--gpus", ""}, "--gpus"},
      {{"--gpus", "x"}, "--gpus"},
      {{"--gpus", "1,y"}, "--gpus"},
      {{"--gpus", "-1"}, "--gpus"},
      {{"--gpus", "0"}, "--gpus"},
      {{"--cpu", "0"}, "--cpu"},
      {{"--cpu", "two"}, "--cpu"},
      {{"--batch-size", "0"}, "--batch-size"},
      {{"--lr", "nan"}, "--lr"},
      {{"--lr", "-0.5"}, "--lr"},
      {{"--epochs", "-1"}, "--epochs"},
      {{"--mode", "fast"}, "--mode"},
      {{"--momentum", "-1"}, "--momentum"},
      {{"--bucket-mb", "0"}, "--bucket-mb"},
      {{"--cpu", "1", "--gpus", "0"}, "--gpus"},
      {{"--load", (scratch_dir() / "missing.safetensors").string()}, "missing.safetensors"},
      {{"--data", (scratch_dir() / "no-such-dir").string()}, "no-such-dir"},
      {{"--data", ""}, "--data", "--data: an empty path"},
      {{"--data", exe_path()}, "--data", "--data: " + exe_path() + " is not a directory"},
      {{"--inject-fault", "1"}, "--inject-fault"},
      {{"--inject-stall", "1:2:nowhere"}, "--inject-stall"},
      {{"--timeout", "-1"}, "--timeout"},
      {{"--on-nan", "ignore"}, "--on-nan"},
      {{"--inject-nan", "1:x"}, "--inject-nan"},
      {{"--inject-nan", "4:1"}, "--inject-nan"},
      {{"--keep", "0"}, "--keep"},
      {{"--keep", "3"}, "--keep"},
      {{"--save-every", "5"}, "--save-every"},
      // Output paths are checked before training starts.
      {{"--save", (scratch_dir() / "no-such-dir" / "model.safetensors").string()}, "--save"},
      {{"--save", scratch_dir().string()}, "--save"},
      {{"--metrics", (scratch_dir() / "no-such-dir" / "metrics.json").string()}, "--metrics"},
      {{"--metrics", scratch_dir().string()}, "--metrics"},
      {{"--trace", (scratch_dir() / "no-such-dir" / "trace.json").string()}, "--trace"},
      {{"--trace", scratch_dir().string()}, "--trace"},
      {{"--trace", (scratch_dir() / "trace.json").string(), "--mode", "dp"}, "--trace"},
      {{"--trace-steps", "0"}, "--trace-steps"},
      {{"--optimizer", "rmsprop"}, "--optimizer"},
      {{"--betas", "0.9"}, "--betas"},
      {{"--betas", "0.9,1"}, "--betas"},
      {{"--eps", "-1"}, "--eps"},
      {{"--rho", "2"}, "--rho"},
      {{"--batch-size", "-1"}, "--batch-size", "--batch-size: must be from 1 to 4294967295, got -1"},
      {{"--warmup", "99999999999999999999"}, "--warmup", "--warmup: must be from 0 to 4294967295, got 99999999999999999999"},
      {{"--epochs", "1.5"}, "--epochs", "--epochs: '1.5' is not a whole number"},
      // One line, whatever a value holds: control characters as \xNN.
      {{"--optimizer", "sg\nd\x1b[1m"}, "--optimizer",
       "--optimizer: no optimizer 'sg\\x0ad\\x1b[1m' (sgd, adam, adamw, adadelta)"},
      // Another optimizer's flags, which would do nothing; an epsilon of 0 (0/0).
      {{"--betas", "0.9,0.99", "--cpu", "1"}, "--betas",
       "--betas: Adam's and AdamW's; the sgd optimizer has none (--optimizer)"},
      {{"--optimizer", "adam", "--rho", "0.9", "--cpu", "1"}, "--rho",
       "--rho: Adadelta's; the adam optimizer has none (--optimizer)"},
      {{"--eps", "1e-6", "--cpu", "1"}, "--eps",
       "--eps: Adam's, AdamW's and Adadelta's; the sgd optimizer has none (--optimizer)"},
      {{"--optimizer", "adadelta", "--eps", "0", "--cpu", "1"}, "--eps",
       "--eps: epsilon 0 must be above 0 (as a float) for adadelta: with 0 its first update divides 0 by 0 "
       "wherever a gradient element is 0"},
      {{"--nesterov", "--cpu", "1"}, "--nesterov"},
      {{"--optimizer", "adam", "--momentum", "0.9", "--cpu", "1"}, "--momentum"},
      {{"--lr-schedule", "linear"}, "--lr-schedule"},
      {{"--lr-schedule", "onecycle", "--warmup", "5", "--cpu", "1"}, "--warmup"},
      {{"--lr-step", "0"}, "--lr-step"},
      {{"--gamma", "0"}, "--gamma"},
      {{"--warmup", "-1"}, "--warmup"},
      {{"--recipe", "slow"}, "--recipe"},
      {{"--recipe", "pytorch-example", "--cpu", "3"}, "--recipe"},
      {{"--target-accuracy", "0"}, "--target-accuracy"},
      {{"--target-accuracy", "101"}, "--target-accuracy"},
      {{"--eval-every", "5"}, "--eval-every"},
      // Numbers as typed: CLI11 alone wraps, saturates, reads octal, overflows a float.
      {{"--seed", "-1"}, "--seed", kSeed + "-1"},
      {{"--seed", "18446744073709551616"}, "--seed", kSeed + "18446744073709551616"},
      {{"--seed", "0x10"}, "--seed", kSeed + "0x10"},
      {{"--seed", "1.5"}, "--seed", kSeed + "1.5"},
      {{"--lr", "1e308"}, "--lr", "--lr: 1e308 is more than a float holds (3.40282e+38)"},
      {{"--lr", "1e-50"}, "--lr", "--lr: 1e-50 is closer to 0 than a float holds (its least above 0: 1.4013e-45)"},
      {{"--lr", "abc"}, "--lr", "--lr: 'abc' is not a number"},
      {{"--lr", "nan"}, "--lr", "--lr: 'nan' is not a number"},
      {{"--lr", "0x10"}, "--lr", "--lr: '0x10' is not a decimal number"},
      {{"--momentum", "1e39"}, "--momentum", "--momentum: 1e39 is more than a float holds (3.40282e+38)"},
      {{"--momentum", "-inf"}, "--momentum", "--momentum: must be >= 0, got -inf"},
      {{"--weight-decay", "inf"}, "--weight-decay", "--weight-decay: must be a finite number, got inf"},
      {{"--weight-decay", "-1e-3"}, "--weight-decay", "--weight-decay: must be >= 0, got -1e-3"},
      {{"--bucket-mb", "-0"}, "--bucket-mb", "--bucket-mb: must be > 0, got -0"},
      {{"--bucket-mb", "1e400"}, "--bucket-mb", "--bucket-mb: 1e400 is more than a double holds (1.79769e+308)"},
      {{"--bucket-mb", "nan"}, "--bucket-mb", "--bucket-mb: 'nan' is not a number"},
      {{"--timeout", "1e-400"}, "--timeout",
       "--timeout: 1e-400 is closer to 0 than a double holds (its least above 0: 4.94066e-324)"},
      {{"--timeout", "inf"}, "--timeout", "--timeout: must be a finite number, got inf"},
      {{"--timeout", "10s"}, "--timeout", "--timeout: '10s' is not a number"},
      {{"--precision", "bf17"}, "--precision"},
      {{"--exchange", "factors", "--mode", "dp", "--cpu", "2"}, "--exchange",
       "--exchange: 'factors' cannot run here: --mode dp gathers the network's outputs instead; use gradients or auto"},
      {{"--precision", "bf16", "--gpus", "0"}, "--precision", "--precision: bf16 runs on CPU devices only; use --cpu N"},
      {{"--precision", "tf32", "--cpu", "2"}, "--precision", kTf32OnGpus},
      {{"--epochs", "1", "--precision", "tf32"}, "--precision", kTf32OnGpus},  // no GPU here: CPU devices
      {{"--tf32", "--cpu", "2"}, "--tf32",
       "--tf32: TF32 runs on GPUs only (a tensor-core format; CPU devices have none); leave it out, or --gpus LIST"},
      {{"--tf32", "--precision", "bf16", "--cpu", "1"}, "--tf32",
       "--tf32: TF32 is a GPU format and --precision bf16 runs on CPU devices: give one of them"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    if (c.args[0] != "--data") args.insert(args.end(), {"--data", data});
    if (c.args[0] != "--cpu" && c.args[0] != "--gpus" && c.args.size() == 2) args.insert(args.end(), {"--cpu", "1"});
    const Outcome o = run_cli(args, 60s);
    SCOPED_TRACE(c.args[0] + " " + c.args.back() + ": " + o.err);
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_EQ(count_lines(o.err), 1);
    EXPECT_EQ(o.err.rfind("mnist_mt: error: ", 0), 0u);
    EXPECT_NE(o.err.find(c.flag), std::string::npos);
    if (!c.says.empty()) {
      EXPECT_EQ(o.err, "mnist_mt: error: " + c.says + "\n");
    }
    EXPECT_EQ(o.out.find("epoch 1"), std::string::npos) << "trained before refusing";
  }
}

// bf16 products need AVX512_BF16 or AMX: with oneDNN held to AVX2 (any x86 CPU) the run is
// refused before it starts, naming the flag, the reason and the way out.
TEST(Cli, Bf16ProductsAreRefusedWhereOneDnnHasNone) {
  const std::string data = small_data().string();
  const Outcome o = run_cli({"--cpu", "1", "--precision", "bf16", "--epochs", "1", "--data", data}, 60s,
                            {"ONEDNN_MAX_CPU_ISA=AVX2"});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  const std::string why = o.err.find("this CPU has neither") != std::string::npos
                              ? "this CPU has neither AVX512_BF16 nor AMX"
                              : "oneDNN does not use this CPU's AVX512_BF16 or AMX (it runs at avx2; ONEDNN_MAX_CPU_ISA=AVX2)";
  EXPECT_EQ(o.err, "mnist_mt: error: --precision: bf16 needs AVX512_BF16 or AMX: " + why + "; use fp32\n");
  EXPECT_EQ(o.out.find("epoch 1"), std::string::npos);
}

// Where the CPU has bf16 products: a bf16 run says so in its metrics and its checkpoint,
// a run resuming that checkpoint in fp32 says that it is not bit for bit (also where its
// layout would repeat the sums), and so does eval.
TEST(Cli, ABf16CheckpointResumesInFp32SayingSo) {
  const fs::path metrics = scratch_dir() / "bf16.json";
  const fs::path checkpoint = scratch_dir() / "bf16.safetensors";
  const std::string data = small_data().string();
  const Outcome bf16 = run_cli({"--cpu", "2", "--batch-size", "4", "--epochs", "1", "--max-steps", "3", "--data", data,
                               "--precision", "bf16", "--metrics", metrics.string(), "--save", checkpoint.string()},
                              60s);
  if (bf16.exit_code == 2 && bf16.err.find("bf16 needs AVX512_BF16 or AMX") != std::string::npos)
    GTEST_SKIP() << bf16.err;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  EXPECT_NE(bf16.out.find("fc1 and fc2 on bf16 operands"), std::string::npos) << bf16.out;
  EXPECT_NE(slurp(metrics).find("\"precision\":\"bf16\""), std::string::npos) << slurp(metrics);
  const Outcome fp32 = run_cli({"--cpu", "1", "--batch-size", "8", "--epochs", "2", "--max-steps", "3", "--data", data,
                               "--load", checkpoint.string()},
                              60s);
  ASSERT_EQ(fp32.exit_code, 0) << fp32.err;
  EXPECT_NE(fp32.out.find("resuming a checkpoint trained with bf16 products with fp32 ones (--precision): not bit "
                          "for bit"),
            std::string::npos)
      << fp32.out;
  // 2 x 4 resumed on 1 x 8 would repeat its sums shard by shard, but not its products.
  EXPECT_NE(fp32.out.find("(not bit for bit: its products were bf16)"), std::string::npos) << fp32.out;
  EXPECT_EQ(fp32.out.find("bit for bit its run"), std::string::npos) << fp32.out;
  // eval says when its products are not the checkpoint's, and its --json names them.
  const fs::path json = scratch_dir() / "bf16-eval.json";
  const Outcome eval = run_cli({"eval", "--load", checkpoint.string(), "--cpu", "1", "--batch-size", "8", "--data", data,
                                "--json", json.string()},
                               60s);
  ASSERT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("was trained with bf16 products, evaluated with fp32 ones (--precision)"), std::string::npos)
      << eval.out;
  EXPECT_NE(slurp(json).find("\"precision\":\"fp32\""), std::string::npos) << slurp(json);
}

// Training's flags before a subcommand are refused, not silently left out of it.
TEST(Cli, AFlagBeforeASubcommandIsRefused) {
  for (const char* command : {"eval", "predict"}) {
    const Outcome o = run_cli({"--precision", "bf16", command, "--load", "x.safetensors"}, 60s);
    EXPECT_EQ(o.exit_code, 2) << command;
    EXPECT_EQ(o.err, std::string("mnist_mt: error: --precision: given before '") + command +
                         "', which takes its flags after it (mnist_mt " + command + " --precision ...)\n");
    const Outcome seed = run_cli({"--seed", "3", command, "--load", "x.safetensors"}, 60s);
    EXPECT_EQ(seed.exit_code, 2) << command;
    EXPECT_EQ(seed.err, std::string("mnist_mt: error: --seed: given before '") + command +
                            "', which has no such flag (training has)\n");
  }
}

// A recipe sets the optimizer, the schedule, the epochs and the batch (a global one split
// over the ranks); a flag given overrides its value; another optimizer than the recipe's
// takes torch.optim's defaults. The start line says what runs.
TEST(Cli, ARecipeSetsTheRunAndFlagsOverrideIt) {
  const std::string data = small_data().string();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--recipe", "pytorch-example"}, "batch 32 per device, adadelta lr 1, step schedule (x0.7 every 1 epoch)"},
      {{"--recipe", "pytorch-example", "--lr", "0.5", "--batch-size", "8"}, "batch 8 per device, adadelta lr 0.5, step"},
      {{"--recipe", "pytorch-example", "--optimizer", "adam"}, "batch 32 per device, adam lr 0.001, step"},
      {{"--recipe", "template"}, "batch 4 per device, sgd lr 0.001, constant"},
      {{"--optimizer", "adamw", "--lr-schedule", "cosine", "--warmup", "3"}, "batch 64 per device, adamw lr 0.001 weight decay 0.01, cosine schedule, 3 warm-up steps"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = c.args;
    args.insert(args.end(), {"--data", data, "--cpu", "2", "--epochs", "1", "--max-steps", "2"});
    const Outcome o = run_cli(args, 120s);
    SCOPED_TRACE(c.args[1] + ": " + o.out + o.err);
    EXPECT_EQ(o.exit_code, 0);
    EXPECT_NE(o.out.find(c.says), std::string::npos);
  }
}

// CLI11 alone reads a leading 0 as octal: --seed 010 would be seed 8.
TEST(Cli, ASeedIsTheDecimalNumberAsTypedUpTo2To64Minus1) {
  for (const auto& [typed, seed] : std::vector<std::pair<std::string, std::string>>{
           {"010", "10"}, {"18446744073709551615", "18446744073709551615"}}) {
    const fs::path checkpoint = scratch_dir() / ("seed" + seed + ".safetensors");
    const Outcome o = run_cli({"--cpu", "1", "--batch-size", "8", "--epochs", "1", "--max-steps", "1", "--data",
                               small_data().string(), "--seed", typed, "--save", checkpoint.string()},
                              60s);
    ASSERT_EQ(o.exit_code, 0) << o.err;
    EXPECT_NE(slurp(checkpoint).find("\"seed\":\"" + seed + "\""), std::string::npos) << typed;
  }
}

// With --download a bad checkpoint found after the data would cost a download first.
TEST(Cli, ABadCheckpointIsRefusedBeforeTheDataIsLookedFor) {
  const std::string missing = (scratch_dir() / "missing.safetensors").string();
  const std::string nowhere = (scratch_dir() / "no-such-dir").string();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--cpu", "1", "--load", missing, "--data", nowhere},
        std::vector<std::string>{"eval", "--cpu", "1", "--load", missing, "--data", nowhere},
        std::vector<std::string>{"predict", "--cpu", "1", "--load", missing, "--data", nowhere, "--index", "0"}}) {
    const Outcome o = run_cli(args, 60s);
    SCOPED_TRACE(args[0] + ": " + o.err);
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_EQ(count_lines(o.err), 1);
    EXPECT_EQ(o.err.rfind("mnist_mt: error: --load: ", 0), 0u);
    EXPECT_NE(o.err.find("missing.safetensors"), std::string::npos);
    EXPECT_EQ(o.err.find("no-such-dir"), std::string::npos);
    EXPECT_EQ(o.out, "");
  }
}

TEST(Cli, TrainsOnASmallDataSetAndWritesMetricsAndACheckpoint) {
  const fs::path metrics = scratch_dir() / "metrics.json";
  const fs::path checkpoint = scratch_dir() / "model.safetensors";
  const Outcome o =
      run_cli({"--cpu", "2", "--batch-size", "8", "--epochs", "2", "--max-steps", "5", "--lr", "0.01", "--momentum",
               "0.9", "--data", small_data().string(), "--metrics", metrics.string(), "--save", checkpoint.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(o.err.empty()) << o.err;
  EXPECT_NE(o.out.find("epoch 2: train loss"), std::string::npos) << o.out;
  const std::string lines = slurp(metrics);
  EXPECT_EQ(count_lines(lines), 2);
  for (const char* key :
       {"\"epoch\":", "\"train_loss\":", "\"test_loss\":", "\"test_accuracy\":", "\"images_per_s\":", "\"seconds\":",
        "\"phase_seconds\":", "\"data_wait\":", "\"forward\":", "\"backward\":", "\"comm_wait\":", "\"optimizer\":",
        "\"precision\":\"fp32\""}) {
    EXPECT_NE(lines.find(key), std::string::npos) << key;
  }
  EXPECT_TRUE(fs::exists(checkpoint));
  // Each rank's threads on a CPU of their own, when the run may use two CPUs (the child
  // inherits this process's mask); else it says why not.
  cpu_set_t mask;
  CPU_ZERO(&mask);
  ASSERT_EQ(sched_getaffinity(0, sizeof mask, &mask), 0);
  const std::string where = CPU_COUNT(&mask) == 2 ? "2 cpu device(s) on CPUs " : "2 cpu device(s) (threads unpinned: 2 ranks for ";
  EXPECT_NE(o.out.find(where), std::string::npos) << o.out;

  // The checkpoint resumes, in the DataParallel mode too; --epochs counts the run's total.
  const Outcome resumed = run_cli({"--cpu", "2", "--mode", "dp", "--batch-size", "8", "--epochs", "3", "--max-steps",
                                   "5", "--data", small_data().string(), "--load", checkpoint.string(), "--no-pin"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("epoch 3: train loss"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("2 cpu device(s), batch 8"), std::string::npos) << resumed.out;
}

TEST(Cli, AnInjectedFaultExits3NamingTheRankAndStepWithinSeconds) {
  for (const char* mode : {"ddp", "dp"}) {
    const auto start = std::chrono::steady_clock::now();
    const Outcome o = run_cli({"--cpu", "3", "--mode", mode, "--batch-size", "8", "--epochs", "1", "--data",
                               small_data().string(), "--inject-fault", "2:4"},
                              60s);
    SCOPED_TRACE(mode);
    EXPECT_EQ(o.exit_code, 3);
    EXPECT_EQ(o.err, "mnist_mt: error: rank 2 failed at step 4: injected fault\n");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  }
}

// Stop names the rank whose loss went NaN and its step; skip drops that step everywhere
// and says so in the summary and the metrics.
TEST(Cli, ANonFiniteStepStopsTheRunOrIsSkipped) {
  for (const char* mode : {"ddp", "dp"}) {
    SCOPED_TRACE(mode);
    const std::vector<std::string> args{"--cpu", "3", "--mode", mode, "--batch-size", "8", "--epochs", "1",
                                        "--max-steps", "6", "--data", small_data().string(), "--inject-nan", "1:3"};
    const Outcome stopped = run_cli(args, 60s);
    EXPECT_EQ(stopped.exit_code, 3);
    EXPECT_EQ(stopped.err.rfind("mnist_mt: error: rank 1 failed at step 3: non-finite training loss", 0), 0u)
        << stopped.err;
    EXPECT_EQ(count_lines(stopped.err), 1) << stopped.err;

    const fs::path metrics = scratch_dir() / (std::string("skipped-") + mode + ".json");
    std::vector<std::string> skip = args;
    skip.insert(skip.end(), {"--on-nan", "skip", "--metrics", metrics.string()});
    const Outcome skipped = run_cli(skip, 60s);
    EXPECT_EQ(skipped.exit_code, 0) << skipped.err;
    EXPECT_NE(skipped.out.find(", 1 of 6 steps skipped (non-finite)"), std::string::npos) << skipped.out;
    EXPECT_NE(slurp(metrics).find("\"skipped_steps\":1,"), std::string::npos) << slurp(metrics);
    EXPECT_EQ(skipped.out.find("nan"), std::string::npos) << skipped.out;
  }
}

}  // namespace
