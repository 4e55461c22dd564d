// dsrun's per-attempt job tokens against the real rendezvous store (loopback
// sockets): the token a rank of attempt 0 was given cannot log in to the
// store of attempt 1, nor can the job's secret itself; attempt 1's ranks can.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "launcher/plan.h"
#include "launcher/rank_env.h"
#include "lib/comm/tcp_store.h"
#include "lib/core/crypto.h"
#include "lib/core/error.h"

using namespace ds;
using namespace std::chrono_literals;

namespace {

// DS_JOB_TOKEN of rank `rank` in the plan of restart attempt `attempt`.
std::string rank_token(const std::string& secret, int attempt, int rank) {
  launch::PlanInputs in;
  in.opts.program = "/bin/train";
  in.opts.include = "localhost:0,1";
  in.opts.max_restarts = 3;
  in.job_token = secret;
  in.attempt = attempt;
  const launch::LaunchPlan p = launch::make_plan(in);
  for (const auto& [k, v] : p.ranks.at(rank).env)
    if (k == "DS_JOB_TOKEN") return v;
  FAIL("no DS_JOB_TOKEN in rank " << rank << "'s environment");
  return "";
}

TcpStoreOptions opts(int port, int rank, const std::string& token) {
  TcpStoreOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.is_server = port == 0;
  o.world_size = 2;
  o.token = token;
  o.rank = rank;
  o.timeout = 3000ms;
  return o;
}

std::string user_error_of(const TcpStoreOptions& o) {
  try {
    TcpStore c(o);
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("rendezvous: a token of attempt 0 cannot log in to attempt 1's store", "[launcher][rendezvous]") {
  const std::string secret = crypto::to_hex(crypto::random_bytes(16));
  const std::string a0 = rank_token(secret, 0, 1), a1 = rank_token(secret, 1, 1);
  REQUIRE(a0 != a1);
  CHECK(rank_token(secret, 1, 0) == a1);  // the ranks of one attempt agree
  TcpStore store(opts(0, 0, rank_token(secret, 1, 0)));  // rank 0 of attempt 1 hosts it
  for (const std::string& stale : {a0, secret, std::string()}) {
    CHECK_THAT(user_error_of(opts(store.port(), 1, stale)),
               Catch::Contains("refused this rank's proof of the job token"));
  }
  TcpStore rank1(opts(store.port(), 1, a1));
  rank1.set("attempt", "1");
  CHECK(store.get("attempt") == "1");
}
