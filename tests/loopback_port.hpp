#pragma once
// A port on 127.0.0.1 where nothing listens: one that was free a moment ago.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

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
