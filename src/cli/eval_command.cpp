#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"
#include "mnist_mt/file_io.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/evaluate.hpp"
#include "outputs.hpp"

namespace mnist_mt::cli {
namespace {

std::string percent(double fraction) {
  char text[16];
  std::snprintf(text, sizeof text, "%.2f%%", 100 * fraction);
  return text;
}

void print(const EvalResult& r, std::ostream& out) {
  char line[128];
  std::snprintf(line, sizeof line, "test loss %.4f, accuracy %s (%llu images)", r.loss, percent(r.accuracy).c_str(),
                static_cast<unsigned long long>(r.samples));
  out << line << "\nper class:";
  const auto classes = r.class_accuracy();
  for (std::size_t c = 0; c < kClasses; ++c) out << "  " << c << ' ' << percent(classes[c]);
  out << "\nconfusion matrix (rows: label, columns: predicted):\n     ";
  for (std::size_t c = 0; c < kClasses; ++c) out << (std::snprintf(line, sizeof line, "%6zu", c), line);
  out << '\n';
  for (std::size_t label = 0; label < kClasses; ++label) {
    out << (std::snprintf(line, sizeof line, "%5zu", label), line);
    for (std::uint64_t n : r.confusion[label]) {
      out << (std::snprintf(line, sizeof line, "%6llu", static_cast<unsigned long long>(n)), line);
    }
    out << '\n';
  }
}

nlohmann::ordered_json to_json(const EvalResult& r, const std::string& checkpoint, bool bf16, bool tf32) {
  nlohmann::ordered_json j;
  j["checkpoint"] = checkpoint;
  j["precision"] = precision_name(bf16, tf32);
  j["samples"] = r.samples;
  j["test_loss"] = r.loss;
  j["test_accuracy"] = r.accuracy;
  auto classes = nlohmann::ordered_json::array();
  for (double a : r.class_accuracy()) classes.push_back(std::isnan(a) ? nlohmann::ordered_json() : nlohmann::ordered_json(a));
  j["class_accuracy"] = classes;
  j["confusion"] = r.confusion;  // [label][predicted]
  return j;
}

}  // namespace


int run_eval(const EvalFlags& f) {
  EvalConfig config;
  config.batch = count_flag(f.batch, 0, "--batch-size");
  config.checkpoint = f.load;
  RunFiles files;
  if (f.json) files.outputs.push_back({*f.json, "--json"});
  files.inputs.push_back({f.load, "--load", true});
  add_data_files(f.data, files);
  check_run_files(files);
  Devices devices = pick_devices(f.device);
  config.devices = devices.ids;
  const Checkpoint trained = load_flag(f.load);  // evaluate() reads it again
  const bool trained_bf16 = trained.bf16_products;
  const bool bf16 = devices.backend->precision() == Precision::kBf16;
  check_host_memory(*devices.backend, config.batch, config.devices.size());
  std::string data_name;
  const Dataset data = load_data(f.data, std::cout, nullptr, &data_name);
  std::cout << "mnist_mt: eval of " << one_line(f.load) << " on " << config.devices.size() << ' ' << devices.backend->name()
            << " device(s)" << (bf16 ? ", fc1 and fc2 on bf16 operands" : "") << std::endl;
  if (trained_bf16 != bf16)
    std::cout << "mnist_mt: " << one_line(f.load) << " was trained with " << precision_name(trained_bf16)
              << " products, evaluated with " << precision_name(bf16)
              << " ones (--precision): its run's test figures may differ in their last digits" << std::endl;
  if (!trained.dataset.empty() && trained.dataset != data_name)
    std::cout << "mnist_mt: " << one_line(f.load) << " was trained on " << trained.dataset << ", evaluated on "
              << data_name << std::endl;
  const EvalResult result = with_flag_names({{"batch", "--batch-size"}, {"load", "--load"}},
                                            [&] { return evaluate(*devices.backend, data, config); });
  print(result, std::cout);
  if (f.json) {
    const std::string text = to_json(result, f.load, bf16, devices.backend->tf32()).dump() + "\n";
    try {
      write_file_atomically(*f.json, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
    } catch (const InputError& e) {
      throw InputError(std::string("--json: ") + e.what());
    } catch (const RuntimeFailure& e) {
      throw RuntimeFailure(std::string("--json: ") + e.what());
    }
  }
  finish_stdout();
  return 0;
}

}  // namespace mnist_mt::cli
