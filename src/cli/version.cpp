#include "mnist_mt/version.hpp"

#include "mnist_mt/backend.hpp"

namespace mnist_mt {

std::string version() { return MNIST_MT_VERSION; }

std::vector<std::string> backends_built() {
  std::vector<std::string> out{"cpu"};
  if (cuda_built()) out.push_back("cuda");
  return out;
}

std::vector<LibraryVersion> library_versions() {
  std::vector<LibraryVersion> out = cpu_library_versions();
  for (auto* layer : {data_library_versions, fetch_library_versions, image_library_versions})
    for (auto& v : layer()) out.push_back(std::move(v));
  for (auto& v : cuda_library_versions()) out.push_back(std::move(v));
  out.push_back(mpi_library_version());
  return out;
}

}  // namespace mnist_mt
