#include "mnist_mt/catalog.hpp"

#include "mnist_mt/gunzip.hpp"
#include "mnist_mt/model.hpp"
#include "md5.hpp"

namespace mnist_mt {
namespace {

// The decompressed sizes: a 16-byte IDX header and the images, or an 8-byte one and the labels.
constexpr std::uint64_t kTrainImages = 60000ull * kImageBytes + 16;
constexpr std::uint64_t kTrainLabels = 60000ull + 8;
constexpr std::uint64_t kTestImages = 10000ull * kImageBytes + 16;
constexpr std::uint64_t kTestLabels = 10000ull + 8;

// .gz checksums and mirror order: torchvision's datasets/mnist.py (MNIST, FashionMNIST).
// Content checksums: computed from the genuine files (MNIST as the IDX files themselves,
// Fashion-MNIST decompressed from Debian's dataset-fashion-mnist) and equal to the
// values published beside the data sets.
const DatasetSpec kMnist{
    "MNIST",
    {"http://yann.lecun.com/exdb/mnist/", "https://ossci-datasets.s3.amazonaws.com/mnist/"},
    {{{"train-images-idx3-ubyte", "f68b3c2dcbeaaa9fbdd348bbdeb94873", "6bbc9ace898e44ae57da46a324031adb", kTrainImages},
      {"train-labels-idx1-ubyte", "d53e105ee54ea40749a09fcbcd1e9432", "a25bea736e30d166cdddb491f175f624", kTrainLabels},
      {"t10k-images-idx3-ubyte", "9fb629c4189551a2d022fa330f9573f3", "2646ac647ad5339dbf082846283269ea", kTestImages},
      {"t10k-labels-idx1-ubyte", "ec29112dd5afa0611ce80d1b7f02629c", "27ae3e4e09519cfbb04c329615203637", kTestLabels}}}};

const DatasetSpec kFashionMnist{
    "Fashion-MNIST",
    {"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"},
    {{{"train-images-idx3-ubyte", "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "f4a8712d7a061bf5bd6d2ca38dc4d50a", kTrainImages},
      {"train-labels-idx1-ubyte", "25c81989df183df01b3e8a0aad5dffbe", "9018921c3c673c538a1fc5bad174d6f9", kTrainLabels},
      {"t10k-images-idx3-ubyte", "bef4ecab320f06d8554ea6380940ec79", "8181f5470baa50b63fa0f6fddb340f0a", kTestImages},
      {"t10k-labels-idx1-ubyte", "bb300cfdad3c16e7a12a480ee83cd310", "15d484375f8d13e6eb1aabb0c3f46965", kTestLabels}}}};

}  // namespace

const DatasetSpec& dataset_spec(DatasetKind kind) { return kind == DatasetKind::kMnist ? kMnist : kFashionMnist; }

bool verifies(const FileSpec& file, const std::vector<std::uint8_t>& bytes) {
  if (!is_gzip(bytes)) return bytes.size() == file.content_bytes && md5_hex(bytes) == file.content_md5;
  if (md5_hex(bytes) == file.gz_md5) return true;
  const auto content = gunzip(bytes, file.content_bytes);
  return content && content->size() == file.content_bytes && md5_hex(*content) == file.content_md5;
}

}  // namespace mnist_mt
