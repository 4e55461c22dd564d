// Helpers shared by the rendezvous store tests: client options for a store on
// 127.0.0.1.
#pragma once
#include <chrono>
#include <string>

#include "lib/comm/tcp_store.h"

namespace ds::test {

inline TcpStoreOptions client_opts(int port, int rank, const std::string& token = "tok",
                                   std::chrono::milliseconds t = std::chrono::milliseconds(5000)) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = token;
  o.rank = rank;
  o.timeout = t;
  return o;
}

}  // namespace ds::test
