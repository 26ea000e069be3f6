// step_trace: N training steps of one replica, written down so that PyTorch can take the
// same steps (tests/gpu/torch_compare.py): the initial weights, step 0's gradients, each
// step's loss, and each step's samples and dropout masks. The batches are the first N
// of epoch 0's order for one rank, as the trainer takes them.
//   step_trace --backend cuda|cpu --data DIR --out DIR [--steps N] [--batch B]
//              [--precision fp32|tf32|bf16] ...   (tf32: --backend cuda only)
// Writes OUT/init.safetensors, OUT/grads.safetensors (step 0's gradients, in the
// parameters' places), OUT/masks.bin (per step, per sample: kFlat then kHidden bytes,
// 1 = kept) and OUT/trace.json.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mnist_mt/backend.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/dataset.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"
#include "mnist_mt/philox.hpp"
#include "mnist_mt/sampler.hpp"
#include "model/replica_testing.hpp"

namespace mnist_mt {
namespace {

struct Options {
  std::string backend = "cuda";
  std::filesystem::path data = "/usr/share/datasets/fashion-mnist";  // Debian's Fashion-MNIST
  std::filesystem::path out;
  std::uint32_t steps = 200;
  std::uint32_t batch = 64;
  std::uint64_t seed = 1;
  float lr = 0.01f;
  float momentum = 0.9f;
  bool deterministic = false;
  std::string precision = "fp32";
};

Batch batch_at(const Split& split, const std::vector<std::uint32_t>& order, std::uint32_t step, std::uint32_t size) {
  Batch b;
  b.step = step;
  b.size = size;
  for (std::uint32_t i = 0; i < size; ++i) {
    const std::uint32_t sample = order[std::size_t{step} * size + i];
    b.images.insert(b.images.end(), split.image(sample), split.image(sample) + kImageBytes);
    b.labels.push_back(split.labels[sample]);
    b.indices.push_back(sample);
  }
  return b;
}

// The masks the replica drew (docs/architecture.md decision 9), computed again on the host.
void write_masks(std::ofstream& out, const Batch& b, std::uint64_t seed) {
  std::vector<char> bytes;
  for (std::uint32_t n = 0; n < b.size; ++n) {
    for (std::uint32_t e = 0; e < kFlat; ++e)
      bytes.push_back(dropout_keep(seed, 0, b.indices[n], RandomStream::kDropout0, e, kDropout1) ? 1 : 0);
    for (std::uint32_t e = 0; e < kHidden; ++e)
      bytes.push_back(dropout_keep(seed, 0, b.indices[n], RandomStream::kDropout1, e, kDropout2) ? 1 : 0);
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void save_params(const std::filesystem::path& path, std::vector<float> values, std::uint64_t seed) {
  Checkpoint c;
  c.params = std::move(values);
  c.seed = seed;
  save_checkpoint(path, c);
}

void trace(const Options& o) {
  const Dataset data = load_dataset(o.data);
  if (std::uint64_t{o.steps} * o.batch > data.train.size())
    throw InputError("--steps x --batch exceeds the " + std::to_string(data.train.size()) + " training images");
  std::filesystem::create_directories(o.out);
  BackendOptions options;
  options.deterministic = o.deterministic;
  options.precision = o.precision == "bf16" ? Precision::kBf16 : Precision::kFp32;
  options.tf32 = o.precision == "tf32";
  if (options.tf32 && o.backend != "cuda") throw InputError("--precision tf32 runs on --backend cuda only");
  auto backend = o.backend == "cpu" ? make_cpu_backend(options) : make_cuda_backend(options);
  const int ids[] = {0};
  auto devices = backend->make_devices(ids);
  devices[0]->activate();
  auto replica = backend->make_replica(*devices[0], o.batch);

  const std::vector<float> params = initial_parameters(o.seed);
  replica->write_params(params);
  save_params(o.out / "init.safetensors", params, o.seed);

  const std::vector<std::uint32_t> order = epoch_permutation(o.seed, 0, data.train.size());
  std::ofstream masks(o.out / "masks.bin", std::ios::binary);
  nlohmann::json losses = nlohmann::json::array();
  for (std::uint32_t step = 0; step < o.steps; ++step) {
    const Batch b = batch_at(data.train, order, step, o.batch);
    replica->set_input(b);
    replica->forward(true, {o.seed, 0}, b.size);
    replica->backward([](int) {});
    if (step == 0) {
      std::vector<float> grads(kParamCount);
      ReplicaTesting::read_grads(*replica, grads);
      save_params(o.out / "grads.safetensors", std::move(grads), o.seed);
    }
    losses.push_back(replica->take_stats().loss_sum / b.size);
    replica->update(OptimizerOptions{o.lr, o.momentum, 0.0});
    write_masks(masks, b, o.seed);
  }
  devices[0]->synchronize();
  nlohmann::json t{{"backend", o.backend}, {"steps", o.steps},     {"batch", o.batch},
                   {"seed", o.seed},       {"lr", o.lr},           {"momentum", o.momentum},
                   {"flat", kFlat},        {"hidden", kHidden},    {"dropout", {kDropout1, kDropout2}},
                   {"precision", o.precision},
                   {"losses", losses}};
  nlohmann::json indices = nlohmann::json::array();
  for (std::uint32_t step = 0; step < o.steps; ++step)
    indices.push_back(std::vector<std::uint32_t>(order.begin() + std::size_t{step} * o.batch,
                                                 order.begin() + std::size_t{step + 1} * o.batch));
  t["indices"] = indices;
  std::ofstream(o.out / "trace.json") << t.dump() << '\n';
}

}  // namespace
}  // namespace mnist_mt

int main(int argc, char** argv) {
  mnist_mt::Options o;
  CLI::App app{"N training steps of one replica, written down for PyTorch to repeat"};
  app.add_option("--backend", o.backend)->check(CLI::IsMember({"cuda", "cpu"}));
  app.add_option("--data", o.data);
  app.add_option("--out", o.out)->required();
  app.add_option("--steps", o.steps)->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch)->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed);
  app.add_option("--lr", o.lr);
  app.add_option("--momentum", o.momentum);
  app.add_flag("--deterministic", o.deterministic);
  app.add_option("--precision", o.precision)->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  try {
    mnist_mt::trace(o);
  } catch (const mnist_mt::InputError& e) {
    std::cerr << "step_trace: " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "step_trace: " << e.what() << '\n';
    return 3;
  }
  return 0;
}
