#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>

#include "commands.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/image.hpp"
#include "mnist_mt/predict.hpp"
#include "outputs.hpp"

namespace mnist_mt::cli {


int run_predict(const PredictFlags& f) {
  if (f.images.empty() && f.indices.empty()) throw InputError("predict: give IMAGE files or --index N");
  std::vector<DigitImage> images;
  std::vector<std::string> names;
  for (const std::string& path : f.images) {
    images.push_back(load_digit_image(path));
    names.push_back(path);
  }
  std::vector<int> labels(images.size(), -1);
  const Checkpoint checkpoint = load_flag(f.load);
  Devices devices = pick_devices(f.device);
  if (!f.indices.empty()) {
    const Dataset data = load_data(f.data, std::cout);
    for (std::int64_t index : f.indices) {
      if (index < 0 || index >= static_cast<std::int64_t>(data.test.size())) {
        throw InputError("--index: " + std::to_string(index) + " is not one of the " +
                         std::to_string(data.test.size()) + " test images (0 to " +
                         std::to_string(data.test.size() - 1) + ")");
      }
      DigitImage image;
      std::copy_n(data.test.image(static_cast<std::uint32_t>(index)), kImageBytes, image.begin());
      images.push_back(image);
      names.push_back("test image " + std::to_string(index));
      labels.push_back(data.test.labels[static_cast<std::size_t>(index)]);
    }
  }
  const std::vector<Prediction> predictions = predict(*devices.backend, devices.ids.front(), checkpoint, images);
  for (std::size_t i = 0; i < predictions.size(); ++i) {
    const Prediction& p = predictions[i];
    char line[64];
    std::snprintf(line, sizeof line, ": %d (probability %.4f)", p.digit, p.probability[p.digit]);
    std::cout << one_line(names[i]) << line;
    if (labels[i] >= 0) std::cout << ", label " << labels[i];
    std::cout << '\n';
  }
  finish_stdout();
  return 0;
}

}  // namespace mnist_mt::cli
