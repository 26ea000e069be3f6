#include <iostream>

#include "commands.hpp"
#include "mnist_mt/version.hpp"

namespace mnist_mt::cli {

void print_version() {
  std::cout << "mnist_mt " << version() << "\nbackends:";
  for (const std::string& b : backends_built()) std::cout << ' ' << b;
  std::cout << "\nbuilt with:";
  const auto libraries = library_versions();
  for (std::size_t i = 0; i < libraries.size(); ++i) {
    std::cout << (i == 0 ? " " : ", ") << libraries[i].name << ' ' << libraries[i].version;
  }
  std::cout << std::endl;
}

}  // namespace mnist_mt::cli
