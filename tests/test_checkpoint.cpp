// safetensors checkpoints: round trip, PyTorch's names and shapes, atomic writes (through
// links, never over what is not a regular file, no temp file outliving its writer),
// strict rejection of damaged files, and a file written by PyTorch's side (tests/golden).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <limits>
#include <random>
#include <string>

#include "mnist_mt/file_io.hpp"
#include "golden/fixture.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

namespace mnist_mt {
namespace {

namespace fs = std::filesystem;
using testing::Fixture;

constexpr OptimizerKind kOptimizers[] = {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW,
                                         OptimizerKind::kAdadelta};

// With the optimizer's state buffers, or of parameters only.
Checkpoint sample_checkpoint(bool with_state, OptimizerKind optimizer = OptimizerKind::kSgd) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  Checkpoint c;
  c.params.resize(kParamCount);
  for (float& v : c.params) v = dist(rng);
  c.optimizer = optimizer;
  if (with_state) {
    for (int b = 0; b < state_buffers(optimizer); ++b) {
      std::vector<float>& buffer = b == 0 ? c.state.first : c.state.second;
      buffer.resize(kParamCount);
      for (float& v : buffer) v = dist(rng);
    }
    c.state.applied = 6543210900ull;
  }
  c.epoch = 7;
  c.step = 6543210987ull;
  c.epoch_step = 123;
  c.seed = 0xfedcba9876543210ull;
  c.world = 6;
  c.batch = 48;
  c.shard_order = true;
  c.fc1_factors = !with_state;  // each value of both flags in one of the two samples
  c.bf16_products = with_state;
  if (with_state) {
    c.test_accuracy = 0.987654321;
    c.settings = {{"--optimizer", "sgd"}, {"--lr", "0.0123"}, {"--betas", "0.9,0.999"}};
    c.dataset = "Fashion-MNIST";
  }
  return c;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mnist_mt_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<fs::path> entries() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename());
    return out;
  }

  // A valid checkpoint's header JSON and data section, after `edit` changed them, written
  // back as a file.
  fs::path edited(const std::function<void(nlohmann::ordered_json&, std::string&)>& edit) {
    if (valid_.empty()) {
      save_checkpoint(dir_ / "valid.safetensors", sample_checkpoint(true));
      valid_ = read_bytes(dir_ / "valid.safetensors");
    }
    std::uint64_t n = 0;
    std::memcpy(&n, valid_.data(), 8);
    auto header = nlohmann::ordered_json::parse(valid_.substr(8, n));
    std::string data = valid_.substr(8 + n);
    edit(header, data);
    const std::string text = header.dump();
    const std::uint64_t length = text.size();
    const fs::path path = dir_ / "edited.safetensors";
    write_bytes(path, std::string(reinterpret_cast<const char*>(&length), 8) + text + data);
    return path;
  }

  void expect_rejected(const fs::path& path, const std::string& problem) {
    try {
      load_checkpoint(path);
      ADD_FAILURE() << "accepted a file that should fail with: " << problem;
    } catch (const InputError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(path.string() + ": ", 0), 0u) << message;
      EXPECT_NE(message.find(problem), std::string::npos) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    }
  }

  fs::path dir_;
  std::string valid_;
};

TEST_F(CheckpointTest, RoundTripsParametersOptimizerStateAndLoopState) {
  for (const OptimizerKind optimizer : kOptimizers)
  for (bool with_state : {true, false}) {
    SCOPED_TRACE(::testing::Message() << optimizer_name(optimizer) << (with_state ? " with state" : " without state"));
    const Checkpoint saved = sample_checkpoint(with_state, optimizer);
    const fs::path path = dir_ / "model.safetensors";
    save_checkpoint(path, saved);
    const Checkpoint loaded = load_checkpoint(path);
    EXPECT_EQ(loaded.params, saved.params);
    EXPECT_EQ(loaded.optimizer, saved.optimizer);
    EXPECT_EQ(loaded.state.first, saved.state.first);
    EXPECT_EQ(loaded.state.second, saved.state.second);
    EXPECT_EQ(loaded.state.applied, saved.state.applied);
    EXPECT_EQ(loaded.epoch, saved.epoch);
    EXPECT_EQ(loaded.step, saved.step);
    EXPECT_EQ(loaded.epoch_step, saved.epoch_step);
    EXPECT_EQ(loaded.seed, saved.seed);
    EXPECT_EQ(loaded.world, saved.world);
    EXPECT_EQ(loaded.batch, saved.batch);
    EXPECT_EQ(loaded.shard_order, saved.shard_order);
    EXPECT_EQ(loaded.fc1_factors, saved.fc1_factors);
    EXPECT_EQ(loaded.bf16_products, saved.bf16_products);
    EXPECT_EQ(loaded.test_accuracy, saved.test_accuracy);  // its bits
    EXPECT_EQ(loaded.settings, saved.settings);
    EXPECT_EQ(loaded.dataset, saved.dataset);
    EXPECT_EQ(entries(), std::vector<fs::path>{"model.safetensors"});
  }
}

// What PyTorch's load_state_dict needs: the state-dict names, F32, PyTorch's shapes, and the
// values of each parameter in its own byte range; the optimizer's state under the names
// of torch.optim's state. Read with the tests' own reader.
TEST_F(CheckpointTest, WritesPyTorchNamesShapesAndValues) {
  const std::vector<std::pair<OptimizerKind, std::vector<std::string>>> cases{
      {OptimizerKind::kSgd, {"momentum_buffer."}},
      {OptimizerKind::kAdam, {"exp_avg.", "exp_avg_sq."}},
      {OptimizerKind::kAdamW, {"exp_avg.", "exp_avg_sq."}},
      {OptimizerKind::kAdadelta, {"square_avg.", "acc_delta."}}};
  for (const auto& [optimizer, prefixes] : cases) {
    const Checkpoint saved = sample_checkpoint(true, optimizer);
    const fs::path path = dir_ / "model.safetensors";
    save_checkpoint(path, saved);
    const Fixture file(path);
    EXPECT_EQ(file.meta("optimizer"), optimizer_name(optimizer));
    EXPECT_EQ(file.meta("optimizer_step"), "6543210900");
    for (const ParamInfo& p : kParams) {
      for (std::size_t b = 0; b <= prefixes.size(); ++b) {
        const std::string prefix = b == 0 ? "" : prefixes[b - 1];
        const auto& t = file.tensor(prefix + std::string(p.name));
        EXPECT_EQ(t.dtype, "F32");
        EXPECT_EQ(t.shape, std::vector<std::int64_t>(p.shape.begin(), p.shape.begin() + p.dims)) << p.name;
        const auto values = t.as<float>();
        const auto& source = b == 0 ? saved.params : b == 1 ? saved.state.first : saved.state.second;
        EXPECT_TRUE(std::equal(values.begin(), values.end(), source.begin() + static_cast<std::ptrdiff_t>(p.offset)))
            << prefix << p.name;
      }
    }
  }
  const Fixture file(dir_ / "model.safetensors");
  EXPECT_EQ(file.meta("epoch"), "7");
  EXPECT_EQ(file.meta("step"), "6543210987");
  EXPECT_EQ(file.meta("seed"), std::to_string(0xfedcba9876543210ull));
  // safetensors readers map the data section; it starts 8-byte aligned.
  std::uint64_t n = 0;
  std::memcpy(&n, read_bytes(dir_ / "model.safetensors").data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST_F(CheckpointTest, OverwritesAnExistingCheckpoint) {
  const fs::path path = dir_ / "model.safetensors";
  save_checkpoint(path, sample_checkpoint(true));
  Checkpoint second = sample_checkpoint(false);
  second.epoch = 8;
  save_checkpoint(path, second);
  EXPECT_EQ(load_checkpoint(path).epoch, 8u);
  EXPECT_TRUE(load_checkpoint(path).state.first.empty());
  EXPECT_EQ(entries(), std::vector<fs::path>{"model.safetensors"});
}

// A write that fails half-way (the file size limit stands in for a full disk) leaves the
// previous checkpoint as it was and no temp file behind.
TEST_F(CheckpointTest, FailedWriteKeepsTheOldFile) {
  const fs::path path = dir_ / "model.safetensors";
  save_checkpoint(path, sample_checkpoint(false));
  const std::string before = read_bytes(path);

  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    save_checkpoint(path, sample_checkpoint(true));
  } catch (const RuntimeFailure& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);

  EXPECT_TRUE(threw);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(entries(), std::vector<fs::path>{"model.safetensors"});
}

TEST_F(CheckpointTest, FailedRenameLeavesNoTempFile) {
  const fs::path path = dir_ / "occupied";
  fs::create_directories(path / "inside");  // a non-empty directory cannot be replaced
  EXPECT_THROW(save_checkpoint(path, sample_checkpoint(false)), InputError);
  EXPECT_EQ(entries(), std::vector<fs::path>{"occupied"});
}

TEST_F(CheckpointTest, MissingDirectoryIsAnInputError) {
  const fs::path path = dir_ / "no" / "such" / "model.safetensors";
  try {
    save_checkpoint(path, sample_checkpoint(false));
    ADD_FAILURE() << "saved into a missing directory";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(path.string() + ": ", 0), 0u) << e.what();
  }
}

// A save writes through a symbolic link: the link stays, its target gets the new bytes,
// and a link to nothing yet makes its target.
TEST_F(CheckpointTest, ASaveWritesThroughASymbolicLinkWhichStays) {
  fs::create_directories(dir_ / "real");
  write_bytes(dir_ / "real" / "model.safetensors", "old");
  fs::create_symlink("real/model.safetensors", dir_ / "model.safetensors");
  fs::create_symlink(dir_ / "real" / "later.safetensors", dir_ / "later.safetensors");
  for (const char* name : {"model.safetensors", "later.safetensors"}) {
    SCOPED_TRACE(name);
    const fs::path link = dir_ / name;
    const fs::path target = fs::read_symlink(link);
    save_checkpoint(link, sample_checkpoint(false));
    EXPECT_TRUE(fs::is_symlink(link));
    EXPECT_EQ(fs::read_symlink(link), target);
    EXPECT_EQ(load_checkpoint(dir_ / "real" / name).epoch, 7u);
  }
  std::vector<fs::path> real;
  for (const auto& e : fs::directory_iterator(dir_ / "real")) real.push_back(e.path().filename());
  std::sort(real.begin(), real.end());
  EXPECT_EQ(real, (std::vector<fs::path>{"later.safetensors", "model.safetensors"}));  // no temp file
}

// What is not a regular file is never replaced, even through a link, and a FIFO is
// refused as a checkpoint to load without waiting for a writer.
TEST_F(CheckpointTest, ASaveRefusesWhatIsNotARegularFileAndLoadDoesNotWaitOnAFifo) {
  ASSERT_EQ(::mkfifo((dir_ / "fifo").c_str(), 0644), 0);
  fs::create_directories(dir_ / "directory");
  const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string sock_path = (dir_ / "socket").string();
  ASSERT_LT(sock_path.size(), sizeof address.sun_path);
  std::memcpy(address.sun_path, sock_path.c_str(), sock_path.size() + 1);
  ASSERT_EQ(::bind(sock, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  ::close(sock);
  fs::create_symlink("fifo", dir_ / "link-to-fifo");
  std::vector<std::string> names{"fifo", "directory", "socket", "link-to-fifo"};
  if (::geteuid() == 0) {  // device nodes: only root may make them
    ASSERT_EQ(::mknod((dir_ / "null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
    names.push_back("null");
  }
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const fs::path path = dir_ / name;
    struct stat before {};
    ASSERT_EQ(::stat(path.c_str(), &before), 0);
    try {
      save_checkpoint(path, sample_checkpoint(false));
      ADD_FAILURE() << "replaced " << path;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
    struct stat after {};
    ASSERT_EQ(::stat(path.c_str(), &after), 0);
    EXPECT_EQ(after.st_mode & S_IFMT, before.st_mode & S_IFMT);
    EXPECT_EQ(after.st_ino, before.st_ino);
  }
  const auto begin = std::chrono::steady_clock::now();
  EXPECT_THROW(load_checkpoint(dir_ / "fifo"), InputError);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(5));
  EXPECT_EQ(entries().size(), names.size());  // no temp file
}

// A save killed half-way leaves its temp file; the next save to that path removes it
// once its writer is gone, and leaves a live writer's alone.
TEST_F(CheckpointTest, TheNextSaveRemovesTheTempFileOfAKilledSave) {
  const fs::path path = dir_ / "model.safetensors";
  const pid_t writer = ::fork();
  if (writer == 0) {
    AtomicFile file(path);
    file.write("partial", 7);
    ::raise(SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(writer, &status, 0), writer);
  ASSERT_TRUE(WIFSIGNALED(status));
  const std::string dead = ".model.safetensors.tmp-" + std::to_string(writer) + "-";
  const auto left = [&](const std::string& prefix) {
    const std::vector<fs::path> all = entries();
    return std::any_of(all.begin(), all.end(), [&](const fs::path& e) { return e.string().starts_with(prefix); });
  };
  ASSERT_TRUE(left(dead));
  const fs::path live = dir_ / (".model.safetensors.tmp-" + std::to_string(::getpid()) + "-999");
  write_bytes(live, "a save in flight");
  save_checkpoint(path, sample_checkpoint(false));
  EXPECT_FALSE(left(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(load_checkpoint(path).epoch, 7u);
}

TEST_F(CheckpointTest, RejectsMissingAndTruncatedFiles) {
  expect_rejected(dir_ / "absent.safetensors", "cannot open");
  const fs::path path = dir_ / "model.safetensors";
  save_checkpoint(path, sample_checkpoint(true));
  const std::string bytes = read_bytes(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const fs::path cut = dir_ / "cut.safetensors";
  for (std::size_t size : {std::size_t{0}, std::size_t{5}, std::size_t{8}, std::size_t{8 + n / 2}}) {
    write_bytes(cut, bytes.substr(0, size));
    expect_rejected(cut, "truncated");
  }
  for (std::size_t size : {std::size_t{8 + n}, std::size_t{8 + n + 1000}, bytes.size() - 1}) {
    write_bytes(cut, bytes.substr(0, size));
    expect_rejected(cut, "outside the");
  }
  write_bytes(cut, bytes + "extra");
  expect_rejected(cut, "the tensors cover");
}

TEST_F(CheckpointTest, RejectsCorruptHeaders) {
  const fs::path path = dir_ / "bad.safetensors";
  std::uint64_t huge = 1ull << 40;
  write_bytes(path, std::string(reinterpret_cast<const char*>(&huge), 8) + "{}");
  expect_rejected(path, "exceeds");
  const std::string text = "{\"conv1.weight\": [1, 2";
  const std::uint64_t n = text.size();
  write_bytes(path, std::string(reinterpret_cast<const char*>(&n), 8) + text);
  expect_rejected(path, "not valid JSON");
  const std::string array = "[1, 2, 3]";
  const std::uint64_t m = array.size();
  write_bytes(path, std::string(reinterpret_cast<const char*>(&m), 8) + array);
  expect_rejected(path, "not a JSON object");
}

void put_float(std::string& data, std::size_t index, float value) {
  std::memcpy(data.data() + index * sizeof(float), &value, sizeof value);
}

TEST_F(CheckpointTest, RejectsMismatchedTensors) {
  using Json = nlohmann::ordered_json;
  using Edit = std::function<void(Json&, std::string&)>;
  const std::vector<std::pair<Edit, std::string>> cases{
      {[](Json& h, std::string&) { h["fc1.weight"]["dtype"] = "F16"; }, "dtype F16"},
      {[](Json& h, std::string&) { h["fc1.weight"]["shape"] = {9216, 128}; }, "shape [9216,128]"},
      {[](Json& h, std::string&) { h["conv1.weight"]["shape"] = {32, 1, 9}; }, "shape [32,1,9]"},
      {[](Json& h, std::string&) { h["conv1.bias"]["shape"] = {32.0}; }, "shape"},
      {[](Json& h, std::string&) { h.erase("fc2.bias"); }, "missing tensor 'fc2.bias'"},
      {[](Json& h, std::string&) { h.erase("momentum_buffer.conv2.bias"); },
       "missing tensor 'momentum_buffer.conv2.bias'"},
      {[](Json& h, std::string&) { h["momentum.fc2.bias"] = h["momentum_buffer.fc2.bias"]; },
       "unexpected tensor 'momentum.fc2.bias'"},
      {[](Json& h, std::string&) { h["__metadata__"]["optimizer"] = "adam"; }, "unexpected tensor 'momentum_buffer."},
      {[](Json& h, std::string&) { h["__metadata__"]["optimizer"] = "rmsprop"; },
       "metadata 'optimizer' is \"rmsprop\", not sgd, adam, adamw or adadelta"},
      {[](Json& h, std::string&) { h["__metadata__"].erase("optimizer_step"); }, "metadata has no 'optimizer_step'"},
      {[](Json& h, std::string&) { h["fc3.weight"] = h["fc2.bias"]; }, "unexpected tensor 'fc3.weight'"},
      {[](Json& h, std::string&) { h["fc2.bias"]["data_offsets"] = {0, 40}; }, "overlap"},
      {[](Json& h, std::string&) { h["fc2.bias"]["data_offsets"] = {-8, 32}; }, "no valid data_offsets"},
      {[](Json& h, std::string&) { h["fc2.bias"]["data_offsets"] = {0, 1ull << 50}; }, "outside the"},
      {[](Json& h, std::string&) { h["fc2.bias"]["data_offsets"] = {0, 41}; }, "41 bytes, expected 40"},
      {[](Json&, std::string& d) { d += std::string(8, '\0'); }, "the tensors cover"},
      {[](Json& h, std::string&) { h.erase("__metadata__"); }, "no __metadata__"},
      {[](Json& h, std::string&) { h["__metadata__"]["format_version"] = "3"; }, "unsupported format_version"},
      {[](Json& h, std::string&) { h["__metadata__"]["epoch"] = "-1"; }, "'epoch' is not an unsigned integer"},
      {[](Json& h, std::string&) { h["__metadata__"]["step"] = "12x"; }, "'step' is not an unsigned integer"},
      {[](Json& h, std::string&) { h["__metadata__"]["seed"] = "99999999999999999999"; }, "'seed' is not"},
      {[](Json& h, std::string&) { h["__metadata__"].erase("epoch"); }, "metadata has no 'epoch'"},
      {[](Json& h, std::string&) { h["__metadata__"]["epoch"] = 3; }, "not a map of strings"},
      {[](Json& h, std::string&) { h["__metadata__"]["epoch_step"] = "x"; }, "'epoch_step' is not"},
      {[](Json& h, std::string&) { h["__metadata__"].erase("batch"); }, "metadata has no 'batch'"},
      {[](Json& h, std::string&) { h["__metadata__"]["world"] = "0"; }, "'world' 0 and 'batch' 48 must be positive"},
      {[](Json& h, std::string&) { h["__metadata__"]["batch"] = "4294967296"; }, "'batch' is not"},
      {[](Json& h, std::string&) { h["__metadata__"]["sum_order"] = "ranks"; }, "'sum_order' is \"ranks\", not"},
      {[](Json& h, std::string&) { h["__metadata__"]["fc1_exchange"] = "both"; }, "'fc1_exchange' is \"both\", not"},
      {[](Json& h, std::string&) { h["__metadata__"]["products"] = "fp16"; }, "'products' is \"fp16\", not"},
      {[](Json& h, std::string&) { h["__metadata__"]["test_accuracy"] = "1.5"; },
       "metadata 'test_accuracy' is \"1.5\", not a fraction from 0 to 1"},
      {[](Json& h, std::string&) { h["__metadata__"]["test_accuracy"] = "nan"; }, "'test_accuracy' is \"nan\""},
      {[](Json& h, std::string&) { h["__metadata__"]["test_accuracy"] = "0.9x"; }, "'test_accuracy' is \"0.9x\""},
      {[](Json& h, std::string&) { h["__metadata__"]["--lr"] = std::string(65, '9'); },
       "metadata '--lr' is not a setting's value (1 to 64 printable characters)"},
      {[](Json& h, std::string&) { h["__metadata__"]["--momentum"] = "0.9\x1b[2J"; }, "metadata '--momentum' is not"},
      {[](Json& h, std::string&) { h["__metadata__"]["--nesterov"] = ""; }, "metadata '--nesterov' is not"},
      {[](Json& h, std::string&) { h["__metadata__"]["dataset"] = "MNIST\n"; }, "metadata 'dataset' is not"},
      {[](Json&, std::string& d) { put_float(d, 5, std::numeric_limits<float>::quiet_NaN()); },
       "tensor 'conv1.weight' holds a non-finite value at element 5"},
      {[](Json& h, std::string& d) {
         put_float(d, h["momentum_buffer.fc2.bias"]["data_offsets"][0].get<std::size_t>() / 4 + 9,
                   -std::numeric_limits<float>::infinity());
       },
       "tensor 'momentum_buffer.fc2.bias' holds a non-finite value at element 9"},
  };
  for (const auto& [edit, problem] : cases) expect_rejected(edited(edit), problem);
}

// Files of format version 1 held SGD's buffer as "momentum.<name>", no optimizer and no
// count of updates: read as SGD's state, started once a step was taken.
TEST_F(CheckpointTest, ReadsVersion1FilesAsSgdState) {
  const Checkpoint saved = sample_checkpoint(true);
  const fs::path path = edited([](nlohmann::ordered_json& h, std::string&) {
    nlohmann::ordered_json old = nlohmann::ordered_json::object();
    for (auto& [key, value] : h.items()) {
      const std::string name = key.starts_with("momentum_buffer.") ? "momentum." + key.substr(16) : key;
      old[name] = value;
    }
    old["__metadata__"]["format_version"] = "1";
    old["__metadata__"].erase("optimizer");
    old["__metadata__"].erase("optimizer_step");
    h = old;
  });
  const Checkpoint loaded = load_checkpoint(path);
  EXPECT_EQ(loaded.optimizer, OptimizerKind::kSgd);
  EXPECT_EQ(loaded.state.first, saved.state.first);
  EXPECT_TRUE(loaded.state.second.empty());
  EXPECT_EQ(loaded.state.applied, saved.step);
  EXPECT_EQ(loaded.params, saved.params);
}

// tests/golden/torch_init.safetensors: PyTorch's initial weights, written by gen_golden.py.
TEST_F(CheckpointTest, LoadsTheFileWrittenByPyTorch) {
  const Fixture golden(testing::golden_dir() / "golden.safetensors");
  const Checkpoint c = load_checkpoint(testing::golden_dir() / "torch_init.safetensors");
  EXPECT_EQ(c.epoch, 0u);
  EXPECT_EQ(c.step, 0u);
  EXPECT_EQ(c.world, 0u);  // no layout recorded
  EXPECT_FALSE(c.shard_order);
  EXPECT_EQ(c.seed, std::stoull(golden.meta("torch_seed")));
  EXPECT_TRUE(c.state.first.empty());
  const std::size_t stride = std::stoul(golden.meta("sample_stride"));
  for (const ParamInfo& p : kParams) {
    const auto want = golden.get<float>("torch_init." + std::string(p.name));
    ASSERT_EQ(want.size(), (p.count + stride - 1) / stride);
    for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(c.params[p.offset + i * stride], want[i]) << p.name;
  }
}

// A valid checkpoint's file with its header text replaced by `header`, the data kept.
fs::path with_header(const fs::path& valid, const std::string& header) {
  const std::string bytes = read_bytes(valid);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::uint64_t length = header.size();
  const fs::path path = valid.parent_path() / "rewritten.safetensors";
  write_bytes(path, std::string(reinterpret_cast<const char*>(&length), 8) + header + bytes.substr(8 + n));
  return path;
}

// The header text of a valid checkpoint, without its padding.
std::string header_json(const fs::path& valid) {
  const std::string bytes = read_bytes(valid);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const std::string header = bytes.substr(8, n);
  return header.substr(0, header.find_last_not_of(' ') + 1);
}

// JSON leaves the meaning of a key given twice open: parsers keep the first, the last
// (nlohmann), or refuse. A file that could mean two things is refused.
TEST_F(CheckpointTest, RejectsAKeyTwiceInAnObject) {
  const fs::path valid = edited([](nlohmann::ordered_json&, std::string&) {});
  const std::string text = header_json(valid);
  const std::string metadata = "{\"__metadata__\":{";
  ASSERT_EQ(text.rfind(metadata, 0), 0u) << text;
  std::string twice_epoch = text;
  twice_epoch.insert(metadata.size(), "\"epoch\":\"99\",");
  expect_rejected(with_header(valid, twice_epoch), "header has the key 'epoch' twice in one object");
  // The first copy points at the bytes of momentum_buffer.fc2.bias, of the same size.
  const nlohmann::ordered_json json = nlohmann::ordered_json::parse(text);
  nlohmann::ordered_json first = json["fc2.bias"];
  first["data_offsets"] = json["momentum_buffer.fc2.bias"]["data_offsets"];
  std::string twice_tensor = text;
  twice_tensor.insert(1, "\"fc2.bias\":" + first.dump() + ",");
  expect_rejected(with_header(valid, twice_tensor), "header has the key 'fc2.bias' twice in one object");
}

// safetensors allows spaces after the header's JSON, as padding, and nothing else.
TEST_F(CheckpointTest, RejectsBytesAfterTheHeaderJsonOtherThanSpaces) {
  const fs::path valid = edited([](nlohmann::ordered_json&, std::string&) {});
  const std::string text = header_json(valid);
  EXPECT_NO_THROW(load_checkpoint(with_header(valid, text + std::string(13, ' '))));
  for (const std::string& tail : {std::string("\n"), std::string("  \t"), std::string(" x"), std::string(3, '\0'),
                                  std::string("{}"), std::string("    }")}) {
    SCOPED_TRACE(nlohmann::json(tail).dump());
    expect_rejected(with_header(valid, text + tail),
                    "header has bytes after its JSON other than space padding (from byte " +
                        std::to_string(text.size() + tail.find_first_not_of(' ')) + " of the header)");
  }
  expect_rejected(with_header(valid, " " + text), "header is not a JSON object (it must start with '{')");
}

}  // namespace
}  // namespace mnist_mt
