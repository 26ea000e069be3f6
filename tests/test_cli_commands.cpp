// The subcommands as a user runs them: --version; eval of a saved checkpoint reports
// the training run's last accuracy, with a confusion matrix that adds up; predict
// gives the same answer for a test image, its PNG, its PGM and a PNG twice its size,
// and for a palette PNG and a PGM of maxval 15 of the same samples; malformed images
// are refused, and a file name's control characters escaped; an epoch without steps prints
// no nan; a finished run, or one that reached the target, has nothing to train; a resume
// names the settings it changes; --epochs 0 says it trains nothing; the data flags' errors
// (a directory of the other data set too); --download naming every mirror's failure, and verifying
// Debian's re-compressed Fashion-MNIST by content. No request leaves 127.0.0.1: the
// downloads run behind a proxy setting that points at a closed loopback port.
#include <gtest/gtest.h>
#include <png.h>
#include <poll.h>
#include <pty.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "cli_runner.hpp"
#include "loopback.hpp"

namespace {

using namespace cli_test;
using Json = nlohmann::json;

std::string closed_port() {
  static const std::string port = closed_loopback_port();
  return port;
}

std::vector<std::string> no_network() {
  const std::string proxy = "http://127.0.0.1:" + closed_port();
  return {"http_proxy=" + proxy, "https_proxy=" + proxy, "HTTPS_PROXY=" + proxy, "ALL_PROXY=" + proxy,
          "no_proxy=127.0.0.1", "NO_PROXY=127.0.0.1"};
}

// The small data set's test image `index`, as read back from its IDX file.
std::vector<std::uint8_t> test_image(int index) {
  std::ifstream f(small_data() / "t10k-images-idx3-ubyte", std::ios::binary);
  f.seekg(16 + index * 784);
  std::vector<std::uint8_t> pixels(784);
  f.read(reinterpret_cast<char*>(pixels.data()), 784);
  return pixels;
}

void write_png(const fs::path& path, const std::vector<std::uint8_t>& grey, std::uint32_t side) {
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = side;
  image.height = side;
  image.format = PNG_FORMAT_GRAY;
  ASSERT_NE(png_image_write_to_file(&image, path.c_str(), 0, grey.data(), 0, nullptr), 0) << image.message;
}

void write_pgm(const fs::path& path, const std::vector<std::uint8_t>& grey) {
  std::ofstream f(path, std::ios::binary);
  f << "P5\n28 28\n255\n";
  f.write(reinterpret_cast<const char*>(grey.data()), static_cast<std::streamsize>(grey.size()));
}

// The test image with each pixel made a 2x2 block: area averaging gives it back.
std::vector<std::uint8_t> doubled(const std::vector<std::uint8_t>& grey) {
  std::vector<std::uint8_t> out(56 * 56);
  for (int y = 0; y < 56; ++y)
    for (int x = 0; x < 56; ++x) out[y * 56 + x] = grey[(y / 2) * 28 + x / 2];
  return out;
}

// A checkpoint trained for one epoch of the small data set, and its metrics line.
struct Trained {
  fs::path checkpoint;
  Json metrics;
};
const Trained& trained() {
  static const Trained t = [] {
    Trained r{scratch_dir() / "eval.safetensors", {}};
    const fs::path metrics = scratch_dir() / "eval_metrics.json";
    const Outcome o = run_cli({"--cpu", "2", "--batch-size", "8", "--epochs", "1", "--lr", "0.05", "--momentum",
                               "0.9", "--data", small_data().string(), "--save", r.checkpoint.string(), "--metrics",
                               metrics.string()});
    if (o.exit_code != 0) throw std::runtime_error("training failed: " + o.err);
    r.metrics = Json::parse(slurp(metrics));
    return r;
  }();
  return t;
}

TEST(CliVersion, NamesTheVersionTheBackendsAndEveryLibrary) {
  const Outcome o = run_cli({"--version"});
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_EQ(o.out.rfind("mnist_mt 0.", 0), 0u) << o.out;
  EXPECT_NE(o.out.find("backends: cpu"), std::string::npos) << o.out;
  for (const char* lib : {"oneDNN 2.", "oneTBB 20", "CUDA ", "cuDNN ", "NCCL ", "libcurl 7.", "libpng 1.", "MPI "}) {
    EXPECT_NE(o.out.find(lib), std::string::npos) << lib << " in " << o.out;
  }
}

TEST(CliEval, ReportsTheTrainingRunsLastAccuracyAndAConfusionMatrixThatAddsUp) {
  const fs::path json = scratch_dir() / "eval.json";
  const Outcome o = run_cli({"eval", "--load", trained().checkpoint.string(), "--cpu", "2", "--batch-size", "8",
                             "--data", small_data().string(), "--json", json.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_TRUE(o.err.empty()) << o.err;
  EXPECT_NE(o.out.find("per class:"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("confusion matrix (rows: label, columns: predicted):"), std::string::npos) << o.out;
  const Json r = Json::parse(slurp(json));
  EXPECT_EQ(r["samples"], 50);
  EXPECT_EQ(r["precision"], "fp32");
  EXPECT_EQ(r["test_accuracy"].get<double>(), trained().metrics["test_accuracy"].get<double>());
  EXPECT_NEAR(r["test_loss"].get<double>(), trained().metrics["test_loss"].get<double>(), 1e-9);
  std::uint64_t total = 0, diagonal = 0;
  for (int label = 0; label < 10; ++label) {
    for (int predicted = 0; predicted < 10; ++predicted) {
      total += r["confusion"][label][predicted].get<std::uint64_t>();
      if (label == predicted) diagonal += r["confusion"][label][predicted].get<std::uint64_t>();
    }
  }
  EXPECT_EQ(total, 50u);
  EXPECT_DOUBLE_EQ(static_cast<double>(diagonal) / 50, r["test_accuracy"].get<double>());
  // Training moved the weights: the small data set is easy.
  EXPECT_GT(r["test_accuracy"].get<double>(), 0.5);
}

TEST(CliPredict, AnIndexItsPngItsPgmAndALargerPngAgree) {
  const std::vector<std::uint8_t> grey = test_image(3);
  const fs::path png = scratch_dir() / "digit.png", pgm = scratch_dir() / "digit.pgm",
                 big = scratch_dir() / "digit56.png";
  write_png(png, grey, 28);
  write_pgm(pgm, grey);
  write_png(big, doubled(grey), 56);
  const Outcome o = run_cli({"predict", "--load", trained().checkpoint.string(), "--cpu", "1", "--data",
                             small_data().string(), "--index", "3", png.string(), pgm.string(), big.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::istringstream lines(o.out);
  std::string line;
  std::vector<std::string> answers;
  while (std::getline(lines, line)) {
    const std::size_t colon = line.find(": ");
    if (line.rfind("mnist_mt:", 0) == 0 || colon == std::string::npos) continue;
    answers.push_back(line.substr(colon, line.find(')') - colon + 1));
  }
  ASSERT_EQ(answers.size(), 4u) << o.out;
  for (const std::string& a : answers) EXPECT_EQ(a, answers.back()) << o.out;
  EXPECT_NE(o.out.find("test image 3: "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find(", label "), std::string::npos) << o.out;
}

// A file name's control characters (an escape sequence, a newline) are written as \xNN:
// the answer stays one line, and the terminal is not driven by a name.
TEST(CliPredict, AFileNameWithControlCharactersIsPrintedOnOneLine) {
  const fs::path pgm = scratch_dir() / "digit\x1b[31m\n.pgm";
  write_pgm(pgm, test_image(0));
  const Outcome o = run_cli({"predict", "--load", trained().checkpoint.string(), "--cpu", "1", pgm.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out.rfind((scratch_dir() / "digit\\x1b[31m\\x0a.pgm: ").string(), 0), 0u) << o.out;
  EXPECT_EQ(count_lines(o.out), 1) << o.out;
}

TEST(CliPredict, BadInputsExit2WithOneLineNamingIt) {
  const fs::path text = scratch_dir() / "not_an_image.png";
  std::ofstream(text) << "hello";
  const std::string ckpt = trained().checkpoint.string(), data = small_data().string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"predict", "--load", ckpt, "--cpu", "1", text.string()}, "not_an_image.png"},
      {{"predict", "--load", ckpt, "--cpu", "1", "--data", data, "--index", "50"}, "--index"},
      {{"predict", "--load", ckpt, "--cpu", "1"}, "--index"},
      {{"predict", "--load", (scratch_dir() / "nope.safetensors").string(), "--cpu", "1", text.string()},
       "not_an_image.png"},
      {{"eval", "--load", (scratch_dir() / "nope.safetensors").string(), "--cpu", "1", "--data", data}, "--load"},
      {{"--dataset", "kmnist", "--cpu", "1"}, "--dataset"},
      {{"--mirror", "http://127.0.0.1:1/", "--cpu", "1"}, "--mirror"},
  };
  for (const auto& [args, named] : cases) {
    const Outcome o = run_cli(args, 60s);
    SCOPED_TRACE(args.back() + ": " + o.err);
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_EQ(count_lines(o.err), 1);
    EXPECT_NE(o.err.find(named), std::string::npos);
  }
}

std::string be32(std::uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// An 8-bit PNG made byte by byte, so that it can say what no PNG writer would: colour
// type 0 (grey) or 3 (palette, `palette` its RGB entries), its rows (each a filter byte
// of 0 and `side` samples) in one stored deflate block.
std::string png_bytes(std::uint32_t side, int colour_type, const std::string& rows, const std::string& palette = "") {
  const auto crc = [](const std::string& bytes) {
    std::uint32_t c = 0xffffffffu;
    for (const unsigned char b : bytes) {
      c ^= b;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
  };
  const auto chunk = [&](const std::string& type, const std::string& data) {
    return be32(static_cast<std::uint32_t>(data.size())) + type + data + be32(crc(type + data));
  };
  std::uint32_t a = 1, b = 0;  // Adler-32
  for (const unsigned char c : rows) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  const auto n = static_cast<std::uint16_t>(rows.size());
  const std::string zlib = std::string("\x78\x01\x01", 3) + static_cast<char>(n & 0xff) + static_cast<char>(n >> 8) +
                           static_cast<char>(~n & 0xff) + static_cast<char>((~n >> 8) & 0xff) + rows + be32((b << 16) | a);
  std::string ihdr = be32(side) + be32(side) + static_cast<char>(8) + static_cast<char>(colour_type);
  ihdr += std::string(3, '\0');
  return std::string("\x89PNG\r\n\x1a\n", 8) + chunk("IHDR", ihdr) + (palette.empty() ? "" : chunk("PLTE", palette)) +
         chunk("IDAT", zlib) + chunk("IEND", "");
}

// The rows of a PNG of these samples, side x side.
std::string png_rows(const std::vector<std::uint8_t>& samples, std::uint32_t side) {
  std::string rows;
  for (std::uint32_t y = 0; y < side; ++y) {
    rows += '\0';
    rows.append(reinterpret_cast<const char*>(samples.data()) + y * side, side);
  }
  return rows;
}

// A grey palette of 256 entries holding the test image as indices, and a PGM of it with
// maxval 15 (scaled to 0..255 as the PNG of the same samples is): both as the PNG.
TEST(CliPredict, APalettePngAndAPgmOfAnotherMaxvalGiveTheAnswerOfTheirPng) {
  std::vector<std::uint8_t> grey = test_image(3);
  for (std::uint8_t& v : grey) v = static_cast<std::uint8_t>((v * 15 + 127) / 255 * 17);  // 16 levels
  std::string palette;
  for (int i = 0; i < 256; ++i) palette += std::string(3, static_cast<char>(i));
  const fs::path png = scratch_dir() / "levels.png", indexed = scratch_dir() / "levels_palette.png",
                 pgm = scratch_dir() / "levels15.pgm";
  write_png(png, grey, 28);
  std::ofstream(indexed, std::ios::binary) << png_bytes(28, 3, png_rows(grey, 28), palette);
  {
    std::ofstream f(pgm, std::ios::binary);
    f << "P5\n# maxval 15\n28 28\n15\n";
    for (const std::uint8_t v : grey) f.put(static_cast<char>(v / 17));
  }
  const Outcome o = run_cli({"predict", "--load", trained().checkpoint.string(), "--cpu", "1", png.string(),
                             indexed.string(), pgm.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  std::istringstream lines(o.out);
  std::vector<std::string> answers;
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("mnist_mt:", 0) != 0) answers.push_back(line.substr(line.find(": ")));
  ASSERT_EQ(answers.size(), 3u) << o.out;
  EXPECT_EQ(answers[1], answers[0]) << o.out;
  EXPECT_EQ(answers[2], answers[0]) << o.out;
}

// What a lenient decoder would show as an image: less pixel data than the header says,
// a maxval of 0, a sample above the maxval, a palette index past the palette.
TEST(CliPredict, AMalformedImageExits2WithOneLineNamingItAndTheProblem) {
  const std::string header = "P5\n28 28\n255\n";
  std::string palette_rows = png_rows(std::vector<std::uint8_t>(784, 1), 28);
  palette_rows[1 + 29 * 5 + 7] = 9;  // pixel (7, 5): index 9 of a 2-entry palette
  const std::vector<std::pair<std::string, std::string>> cases = {
      {header + std::string(700, 'x'), "PGM pixel data truncated: 700 bytes, the 28x28 header needs 784"},
      {header + std::string(785, 'x'), "1 bytes after the PGM pixel data"},
      {"P5\n28 28\n0\n" + std::string(784, '\0'), "PGM maxval 0 is not 1 to 65535"},
      {"P5\n28 28\n15\n" + std::string(783, '\0') + "\x10", "PGM sample 16 at pixel 783 exceeds the maxval 15"},
      {"P5\n28\n", "PGM header has no valid height"},
      {png_bytes(28, 3, palette_rows, std::string("\0\0\0\xff\xff\xff", 6)),
       "palette index 9 at pixel 147 is past the 2-entry palette"},
      {png_bytes(28, 0, png_rows(std::vector<std::uint8_t>(784, 7), 28).substr(0, 29 * 20)), "Not enough image data"},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const fs::path image = scratch_dir() / ("malformed" + std::to_string(i) + (i < 5 ? ".pgm" : ".png"));
    std::ofstream(image, std::ios::binary) << cases[i].first;
    // The images are read before the checkpoint: none is needed.
    const Outcome o = run_cli({"predict", "--load", (scratch_dir() / "none.safetensors").string(), "--cpu", "1",
                               image.string()});
    SCOPED_TRACE(cases[i].second + ": " + o.err);
    EXPECT_EQ(o.exit_code, 2);
    EXPECT_EQ(count_lines(o.err), 1);
    EXPECT_NE(o.err.find(image.string() + ": " + cases[i].second), std::string::npos);
  }
}

// Rewrites the metadata of the checkpoint at `path` with `edit`.
template <class Edit>
void edit_metadata(const fs::path& path, Edit edit) {
  const std::string bytes = slurp(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  Json header = Json::parse(bytes.substr(8, n));
  edit(header["__metadata__"]);
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const std::uint64_t length = text.size();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      << std::string(reinterpret_cast<const char*>(&length), 8) + text + bytes.substr(8 + n);
}

// Resumed at step 3 of an epoch that --max-steps cuts to 2, the epoch takes no step:
// its line says so instead of a train loss of nan.
TEST(CliTrain, AnEpochWithNoStepsPrintsNoNan) {
  const fs::path checkpoint = scratch_dir() / "mid_epoch.safetensors";
  const Outcome first = run_cli({"--cpu", "1", "--batch-size", "8", "--epochs", "1", "--max-steps", "3", "--data",
                                 small_data().string(), "--save", checkpoint.string()});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  // Its epoch-end checkpoint made a mid-epoch one: epoch 0, step 3 of it.
  edit_metadata(checkpoint, [](Json& metadata) {
    metadata["epoch"] = "0";
    metadata["epoch_step"] = "3";
  });
  const Outcome o = run_cli({"--cpu", "1", "--batch-size", "8", "--epochs", "1", "--max-steps", "2", "--data",
                             small_data().string(), "--load", checkpoint.string()});
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("epoch 1: no training loss (no steps), test loss "), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("nan"), std::string::npos) << o.out;
}

// A checkpoint that has trained the epochs asked for: one line says so, exit 0, and
// nothing is written (its metrics and the checkpoint stay as they were).
TEST(CliTrain, LoadingAFinishedRunSaysThereIsNothingToTrain) {
  const fs::path checkpoint = scratch_dir() / "finished.safetensors", metrics = scratch_dir() / "finished.json";
  const auto args = [&](int epochs) {
    return std::vector<std::string>{"--cpu", "1", "--batch-size", "8", "--epochs", std::to_string(epochs),
                                    "--max-steps", "2", "--data", small_data().string(), "--save",
                                    checkpoint.string(), "--metrics", metrics.string()};
  };
  ASSERT_EQ(run_cli(args(2)).exit_code, 0);
  const std::string saved = slurp(checkpoint), measured = slurp(metrics);
  for (const auto& [epochs, says] : std::vector<std::pair<int, std::string>>{
           {2, "has finished 2 of 2 epochs"}, {1, "has finished 2 epochs, more than --epochs 1"}}) {
    std::vector<std::string> resume = args(epochs);
    resume.insert(resume.end(), {"--load", checkpoint.string()});
    const Outcome o = run_cli(resume);
    EXPECT_EQ(o.exit_code, 0) << o.err;
    EXPECT_EQ(o.out, "mnist_mt: " + checkpoint.string() + " " + says + "; nothing to train (raise --epochs)\n");
    EXPECT_EQ(o.err, "");
    EXPECT_EQ(slurp(checkpoint), saved);
    EXPECT_EQ(slurp(metrics), measured);
  }
}

// A checkpoint whose run had reached the test accuracy asked for: one line, exit 0, nothing
// written; a higher target trains on.
TEST(CliTrain, LoadingARunThatReachedTheTargetSaysThereIsNothingToTrain) {
  const fs::path checkpoint = scratch_dir() / "reached.safetensors", metrics = scratch_dir() / "reached.json";
  const auto args = [&](const std::string& target) {
    std::vector<std::string> a{"--cpu", "1", "--batch-size", "8", "--epochs", "3", "--max-steps", "2", "--data",
                               small_data().string(), "--save", checkpoint.string(), "--metrics", metrics.string()};
    if (!target.empty()) a.insert(a.end(), {"--target-accuracy", target});
    return a;
  };
  std::vector<std::string> first = args("");
  first[5] = "1";
  ASSERT_EQ(run_cli(first).exit_code, 0);
  const Json epoch = Json::parse(slurp(metrics).substr(0, slurp(metrics).find('\n')));
  const double accuracy = epoch.at("test_accuracy").get<double>();
  ASSERT_GT(accuracy, 0.01) << "a target below the run's accuracy needs an accuracy above 0";
  const std::string saved = slurp(checkpoint), measured = slurp(metrics);
  char percent[16];
  std::snprintf(percent, sizeof percent, "%.2f", 100 * accuracy);
  std::vector<std::string> resume = args(std::to_string(100 * accuracy - 0.5));
  resume.insert(resume.end(), {"--load", checkpoint.string()});
  const Outcome o = run_cli(resume);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("\nmnist_mt: " + checkpoint.string() + " reached " + percent +
                       "% test accuracy at its step 2, --target-accuracy "),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find(": nothing to train, nothing written (raise --target-accuracy)\n"), std::string::npos) << o.out;
  // After the data line: the data flags are checked first.
  EXPECT_EQ(std::count(o.out.begin(), o.out.end(), '\n'), 2) << o.out;
  EXPECT_EQ(slurp(checkpoint), saved);
  EXPECT_EQ(slurp(metrics), measured);
  // Its epochs finished too: that line, naming the target as well.
  resume[5] = "1";
  const Outcome both = run_cli(resume);
  EXPECT_EQ(both.exit_code, 0) << both.err;
  EXPECT_EQ(both.out, "mnist_mt: " + checkpoint.string() +
                          " has finished 1 of 1 epochs; nothing to train (raise --epochs) (its recorded test "
                          "accuracy reaches --target-accuracy too)\n");
  // Its accuracy is another data set's: the run trains, and says why; eval says so too.
  const fs::path other = scratch_dir() / "other_data.safetensors";
  fs::copy_file(checkpoint, other);
  edit_metadata(other, [](Json& metadata) {
    EXPECT_EQ(metadata.at("dataset"), "IDX files");
    metadata["dataset"] = "MNIST";
  });
  const Outcome trains = run_cli({"--cpu", "1", "--batch-size", "8", "--epochs", "2", "--max-steps", "2", "--data",
                                  small_data().string(), "--target-accuracy", resume.at(resume.size() - 3), "--load",
                                  other.string()});
  EXPECT_EQ(trains.exit_code, 0) << trains.err;
  EXPECT_EQ(trains.out.find("nothing to train"), std::string::npos) << trains.out;
  EXPECT_NE(trains.out.find("\nmnist_mt: resuming " + other.string() +
                            " with data set IDX files (its run: MNIST): its steps from here are not those its run "
                            "would have taken\n"),
            std::string::npos)
      << trains.out;
  const Outcome eval = run_cli(
      {"eval", "--cpu", "1", "--batch-size", "8", "--load", other.string(), "--data", small_data().string()});
  EXPECT_EQ(eval.exit_code, 0) << eval.err;
  EXPECT_NE(eval.out.find("\nmnist_mt: " + other.string() + " was trained on MNIST, evaluated on IDX files\n"),
            std::string::npos)
      << eval.out;
  if (accuracy < 1) {
    resume = args(std::to_string(std::min(100.0, 100 * accuracy + 0.5)));
    resume.insert(resume.end(), {"--load", checkpoint.string()});
    const Outcome more = run_cli(resume);
    EXPECT_EQ(more.exit_code, 0) << more.err;
    EXPECT_EQ(more.out.find("nothing to train"), std::string::npos) << more.out;
    EXPECT_NE(slurp(checkpoint), saved);
  }
}

// A resumed run that changes what its checkpoint's run trained with says which settings
// it changed, and that a --seed other than the checkpoint's is not used; the same flags,
// a setting a one-cycle schedule sets itself, or a file that records no settings say
// nothing.
TEST(CliTrain, AResumeNamesTheSettingsItChangesAndAnUnusedSeed) {
  const fs::path checkpoint = scratch_dir() / "changed.safetensors";
  const auto run = [&](std::vector<std::string> more) {
    std::vector<std::string> a{"--max-steps", "2", "--data", small_data().string()};
    if (std::find(more.begin(), more.end(), "--cpu") == more.end()) a.insert(a.end(), {"--cpu", "1"});
    a.insert(a.end(), more.begin(), more.end());
    const Outcome o = run_cli(a);
    EXPECT_EQ(o.exit_code, 0) << o.err;
    return o.out;
  };
  const std::string file = checkpoint.string();
  const std::vector<std::string> saved{"--batch-size", "8", "--lr", "0.05", "--momentum", "0.9", "--epochs", "1",
                                       "--save", file};
  run(saved);
  const std::string same =
      run({"--batch-size", "8", "--lr", "5e-2", "--momentum", "0.9", "--epochs", "2", "--load", file, "--seed", "1"});
  EXPECT_EQ(same.find("resuming"), std::string::npos) << same;
  EXPECT_EQ(same.find("--seed"), std::string::npos) << same;
  const std::string changed = run({"--batch-size", "4", "--lr", "0.05", "--momentum", "0.5", "--nesterov", "--epochs",
                                   "2", "--load", file, "--seed", "7", "--lr-schedule", "step"});
  EXPECT_NE(changed.find("\nmnist_mt: resuming " + file +
                         " with --momentum 0.5 (its run: 0.9), with --nesterov (its run: without --nesterov), "
                         "--lr-schedule step (its run: constant), a global batch of 4 (its run: 8): its steps from "
                         "here are not those its run would have taken\n"
                         "mnist_mt: --seed 7 is not used: a resumed run draws as its checkpoint's did, from seed 1\n"),
            std::string::npos)
      << changed;
  // A resume refused (another optimizer than its state's) says only why.
  const Outcome refused = run_cli({"--cpu", "1", "--max-steps", "2", "--data", small_data().string(), "--batch-size",
                                   "8", "--optimizer", "adam", "--epochs", "2", "--load", file});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_EQ(refused.out.find("resuming"), std::string::npos) << refused.out;
  EXPECT_EQ(count_lines(refused.err), 1) << refused.err;
  // Two ranks' shards computed by one: the sums are that run's, its steps not.
  run({"--cpu", "2", "--batch-size", "4", "--lr", "0.05", "--momentum", "0.9", "--epochs", "1", "--save", file});
  const std::string shards =
      run({"--cpu", "1", "--batch-size", "8", "--lr", "0.05", "--momentum", "0.5", "--epochs", "2", "--load", file});
  EXPECT_NE(shards.find(" a rank, in turn, and summed in its order (with the changes named below)\nmnist_mt: "
                        "resuming " + file + " with --momentum 0.5 (its run: 0.9): its steps"),
            std::string::npos)
      << shards;
  EXPECT_EQ(shards.find("bit for bit its run"), std::string::npos) << shards;
  // A file from before the settings were recorded.
  run(saved);
  edit_metadata(checkpoint, [](Json& metadata) {
    for (auto it = metadata.begin(); it != metadata.end();) it = it.key().starts_with("--") ? metadata.erase(it) : ++it;
  });
  const std::string old = run({"--batch-size", "8", "--lr", "0.05", "--momentum", "0.5", "--epochs", "2", "--load", file});
  EXPECT_EQ(old.find("resuming"), std::string::npos) << old;
  // One-cycle sets the momentum itself; its length is --epochs.
  run({"--batch-size", "8", "--lr", "0.05", "--momentum", "0.9", "--lr-schedule", "onecycle", "--epochs", "1", "--save",
       file});
  const std::string cycled = run({"--batch-size", "8", "--lr", "0.05", "--momentum", "0.8", "--lr-schedule", "onecycle",
                                  "--epochs", "3", "--load", file});
  EXPECT_NE(cycled.find("\nmnist_mt: resuming " + file + " with --epochs 3 (its run: 1): its steps"), std::string::npos)
      << cycled;
  EXPECT_EQ(cycled.find("--momentum"), std::string::npos) << cycled;
}

// A target not reached by the run's end says so, with the accuracy it ended at.
TEST(CliTrain, ATargetNotReachedSaysSo) {
  const Outcome o = run_cli({"--cpu", "1", "--batch-size", "8", "--max-steps", "1", "--data", small_data().string(),
                             "--target-accuracy", "100"});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  const std::string::size_type at = o.out.find("\nmnist_mt: --target-accuracy 100 not reached: test accuracy ");
  ASSERT_NE(at, std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("% at the end\n", at), o.out.size() - 13) << o.out;
}

// --epochs 0 reads the data (the download idiom) and says that it trains nothing.
TEST(CliTrain, NoEpochsSaysNothingIsTrainedAndWritesNothing) {
  const fs::path checkpoint = scratch_dir() / "none.safetensors";
  const Outcome o = run_cli({"--cpu", "1", "--epochs", "0", "--data", small_data().string(), "--save",
                             checkpoint.string()});
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("\nmnist_mt: --epochs 0: nothing to train, nothing written\n"), std::string::npos) << o.out;
  EXPECT_FALSE(fs::exists(checkpoint));
}

// A directory of the other data set than --dataset names is refused, not trained on
// under the name asked for.
TEST(CliData, ADirectoryOfTheOtherDataSetIsRefused) {
  const fs::path debian = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(debian)) GTEST_SKIP() << debian << " is not installed (scripts/setup.sh installs it)";
  const Outcome o = run_cli({"--cpu", "1", "--epochs", "0", "--dataset", "mnist", "--data", debian.string()});
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.err, "mnist_mt: error: --dataset mnist: " + debian.string() + " holds Fashion-MNIST, not MNIST\n");
  const Outcome named = run_cli({"--cpu", "1", "--epochs", "0", "--dataset", "fashion-mnist", "--data", debian.string()});
  EXPECT_EQ(named.exit_code, 0) << named.err;
}

TEST(CliDownload, EveryMirrorFailingExits2WithOneLineNamingTheFileAndEachMirror) {
  const fs::path dir = scratch_dir() / "download_fails";
  const std::string mine = "http://127.0.0.1:" + closed_port() + "/mine/";
  const Outcome o = run_cli({"--download", "--data", dir.string(), "--mirror", mine, "--cpu", "1"}, 60s, no_network());
  EXPECT_EQ(o.exit_code, 2) << o.out << o.err;
  EXPECT_EQ(count_lines(o.err), 1) << o.err;
  for (const std::string& part :
       {(dir / "train-images-idx3-ubyte.gz").string() + ": download failed", mine + "train-images-idx3-ubyte.gz: ",
        std::string("http://yann.lecun.com/exdb/mnist/train-images-idx3-ubyte.gz: "),
        std::string("https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz: ")}) {
    EXPECT_NE(o.err.find(part), std::string::npos) << part << " in " << o.err;
  }
  EXPECT_TRUE(fs::is_empty(dir));  // nothing partial or unverified left
}

TEST(CliDownload, DebiansFashionMnistIsPresentAndVerifiedSoNothingIsFetched) {
  const fs::path debian = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(debian)) GTEST_SKIP() << debian << " is not installed (scripts/setup.sh installs it)";
  const fs::path dir = scratch_dir() / "fashion";
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(debian)) fs::create_symlink(e.path(), dir / e.path().filename());
  const Outcome o = run_cli({"--dataset", "fashion-mnist", "--download", "--data", dir.string(), "--epochs", "0",
                             "--cpu", "1"},
                            60s, no_network());
  ASSERT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(o.out.rfind("mnist_mt: Fashion-MNIST from " + dir.string() + " (--download)\n", 0), 0u) << o.out;
  int verified = 0;
  for (std::size_t at = o.out.find("present, verified"); at != std::string::npos;
       at = o.out.find("present, verified", at + 1)) {
    ++verified;
  }
  EXPECT_EQ(verified, 4) << o.out;
}

// Runs mnist_mt with a terminal for stdout and stderr; returns the exit code and what
// the terminal showed.
Outcome run_on_terminal(const std::vector<std::string>& args, const std::vector<std::string>& env,
                        std::chrono::seconds deadline) {
  const char* exe = std::getenv("MNIST_MT_EXE");
  std::vector<char*> argv{const_cast<char*>(exe)};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int terminal = -1;
  const pid_t pid = forkpty(&terminal, nullptr, nullptr, nullptr);
  if (pid == 0) {
    for (const std::string& entry : env) putenv(const_cast<char*>(entry.c_str()));
    execv(exe, argv.data());
    _exit(127);
  }
  Outcome o;
  const auto until = std::chrono::steady_clock::now() + deadline;
  char buffer[4096];
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{terminal, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = read(terminal, buffer, sizeof buffer);
    if (n <= 0) break;  // EIO: the program closed the terminal
    o.out.append(buffer, static_cast<std::size_t>(n));
  }
  close(terminal);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return o;
    }
    std::this_thread::sleep_for(10ms);
  }
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

TEST(CliDownload, FetchesFromALoopbackMirrorWithProgressOnATerminalAndTrainsOnIt) {
  const fs::path debian = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(debian)) GTEST_SKIP() << debian << " is not installed (scripts/setup.sh installs it)";
  const LoopbackServer server(debian);  // Debian's re-compressed files: they verify by content
  const fs::path dir = scratch_dir() / "fetched";
  const std::string mirror = server.base() + "good/";
  const Outcome o = run_on_terminal({"--dataset", "fashion-mnist", "--download", "--mirror", mirror, "--data",
                                     dir.string(), "--cpu", "1", "--epochs", "1", "--max-steps", "2"},
                                    no_network(), 120s);
  ASSERT_EQ(o.exit_code, 0) << o.out;
  EXPECT_NE(o.out.find("\rtrain-images-idx3-ubyte.gz: 100% of 26.4 MB"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find(dir.string() + "/train-images-idx3-ubyte.gz: fetched from " + mirror +
                       "train-images-idx3-ubyte.gz, verified"),
            std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("60000 training and 10000 test images"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("epoch 1: train loss"), std::string::npos) << o.out;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                                             "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"}));
}

}  // namespace
