#pragma once
// What `mnist_mt --version` prints: the version, the backends built, and the versions
// of the libraries the build was compiled against.
#include <string>
#include <vector>

namespace mnist_mt {

struct LibraryVersion {
  std::string name;
  std::string version;  // "not built" for a backend's library in a build without it
};

std::string version();  // the project's, from meson.build
std::vector<std::string> backends_built();  // "cpu", and "cuda" when built

// Per layer, each from its headers at compile time.
std::vector<LibraryVersion> data_library_versions();   // oneTBB, zlib
std::vector<LibraryVersion> fetch_library_versions();  // libcurl, OpenSSL
std::vector<LibraryVersion> image_library_versions();  // libpng
std::vector<LibraryVersion> cpu_library_versions();   // oneDNN
std::vector<LibraryVersion> cuda_library_versions();  // CUDA, cuDNN, NCCL
LibraryVersion mpi_library_version();                 // the MPI library's own words, or "not built"
std::vector<LibraryVersion> library_versions();       // all of the above

}  // namespace mnist_mt
