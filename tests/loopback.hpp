#pragma once
// What the download tests share: tests/loopback_server.py as a child process
// serving a directory on 127.0.0.1, and a port where nothing listens.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

// A port on 127.0.0.1 where nothing listens: one that was free a moment ago.
inline std::string closed_loopback_port() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = s >= 0 && bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  if (s >= 0) close(s);
  return ok ? std::to_string(ntohs(addr.sin_port)) : std::string("1");  // port 1: nothing there either
}

// Serves `dir` until destroyed (and at most 120 s); base() is "http://127.0.0.1:PORT/".
class LoopbackServer {
 public:
  explicit LoopbackServer(const std::filesystem::path& dir, int stall_seconds = 20) {
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    const char* root = std::getenv("MNIST_MT_SOURCE_ROOT");
    const std::string script = std::string(root == nullptr ? "." : root) + "/tests/loopback_server.py";
    const std::string stall = std::to_string(stall_seconds);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      execlp("python3", "python3", script.c_str(), dir.c_str(), "--stall", stall.c_str(), "--lifetime", "120",
             nullptr);
      _exit(127);
    }
    close(out[1]);
    std::string port;
    char c = 0;
    while (port.size() < 8 && read(out[0], &c, 1) == 1 && c != '\n') port += c;
    close(out[0]);
    if (port.empty()) {
      stop();
      throw std::runtime_error("the loopback server did not start");
    }
    base_ = "http://127.0.0.1:" + port + "/";
  }
  ~LoopbackServer() { stop(); }
  LoopbackServer(const LoopbackServer&) = delete;
  LoopbackServer& operator=(const LoopbackServer&) = delete;

  const std::string& base() const { return base_; }

 private:
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
  }

  pid_t pid_ = -1;
  std::string base_;
};
