// libFuzzer target: the safetensors checkpoint loader. The first byte picks the shape of
// the file: odd, the input is the whole file; even, the input is the JSON header, put
// before a data section of the size a valid checkpoint has (with momentum or without),
// so that the fuzzer reaches the offset, tiling and value checks that a short input
// never would. Bad input must be an InputError; anything else is a finding.
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_file.hpp"
#include "mnist_mt/checkpoint.hpp"
#include "mnist_mt/error.hpp"
#include "mnist_mt/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  std::string file;
  if (mode & 1) {
    file.assign(reinterpret_cast<const char*>(data + 1), size - 1);
  } else {
    const std::uint64_t header = size - 1;
    file.assign(reinterpret_cast<const char*>(&header), 8);
    file.append(reinterpret_cast<const char*>(data + 1), size - 1);
    const std::size_t tensors = (mode & 2) ? 2 : 1;
    file.append(tensors * mnist_mt::kParamCount * sizeof(float), '\0');
    if (mode & 4) {  // a NaN somewhere in the data
      const float nan = __builtin_nanf("");
      std::memcpy(file.data() + file.size() - 4 * (1 + mode % 97), &nan, 4);
    }
  }
  const auto& path = mnist_mt::fuzz::write_input(file.data(), file.size());
  try {
    const mnist_mt::Checkpoint c = mnist_mt::load_checkpoint(path);
    if (c.params.size() != mnist_mt::kParamCount) __builtin_trap();
  } catch (const mnist_mt::InputError&) {
  }
  return 0;
}
