// gloo_communicator.cpp: the Gloo plugin (build/libengine_gloo.so): cpu ranks' collectives through Gloo.
//
// Built as its own shared library, linked with Debian's libgloo (and through it hiredis and ibverbs), and loaded by
// engine/dist.cpp with dlopen when a cpu world of more than one rank is asked for: the engine's programs do not
// depend on Gloo otherwise (the GPU machine has no Gloo). It uses nothing of the engine but the HostCollectives
// interface of engine/dist.h.
//
// Rendezvous: Gloo's FileStore in the world's shared directory, or the TCP store below at MASTER_ADDR:MASTER_PORT
// (each rank publishes its TCP address there, then every pair connects: Gloo's full mesh). Sums: Gloo's ring
// all-reduce for f32 and f64 with its own sum functions; bf16 and f16 through a sum that widens each pair to f32 and
// rounds back to nearest even, the same on every rank.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "engine/dist.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/types.h"

namespace {

using engine::dist::HostCollectives;

float bf16_to_float(uint16_t h) {
  const uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

void sum_bf16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<uint16_t*>(out);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; i++) o[i] = float_to_bf16(bf16_to_float(x[i]) + bf16_to_float(y[i]));
}

void sum_f16(void* out, const void* a, const void* b, size_t n) {
  auto* o = static_cast<gloo::float16*>(out);
  const auto* x = static_cast<const gloo::float16*>(a);
  const auto* y = static_cast<const gloo::float16*>(b);
  for (size_t i = 0; i < n; i++)
    o[i] = gloo::cpu_float2half_rn(gloo::cpu_half2float(x[i]) + gloo::cpu_half2float(y[i]));
}

// The rendezvous over TCP for ranks on several hosts (MASTER_ADDR and MASTER_PORT, as torchrun and Slurm set them;
// Gloo ships only a file store and a Redis one). Rank 0 serves a key-value table on MASTER_PORT; every rank, rank 0
// included, connects to MASTER_ADDR:MASTER_PORT. Requests: 'S' key value (set), 'G' key (the value, once some rank
// has set it). Each message: a 1-byte op, then 4-byte little-endian lengths and the bytes. Only the rendezvous goes
// through it (a few hundred bytes per rank); the collectives run on Gloo's own pairs.
void write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) throw std::runtime_error("the rendezvous connection closed while sending");
    p += w, n -= size_t(w);
  }
}

void read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r <= 0) throw std::runtime_error("the rendezvous connection closed while receiving");
    p += r, n -= size_t(r);
  }
}

void write_blob(int fd, const std::string& b) {
  const uint32_t n = uint32_t(b.size());
  write_all(fd, &n, 4);
  write_all(fd, b.data(), b.size());
}

std::string read_blob(int fd) {
  uint32_t n = 0;
  read_all(fd, &n, 4);
  if (n > (1u << 24)) throw std::runtime_error("a rendezvous message of more than 16 MiB: not this engine's peer");
  std::string b(n, '\0');
  read_all(fd, b.data(), n);
  return b;
}

class TcpStore : public gloo::rendezvous::Store {
 public:
  TcpStore(const std::string& host, int port, bool serve, std::chrono::seconds timeout) {
    if (serve) start_server(port);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {  // the other ranks may start before rank 0 serves
      fd_ = try_connect(host, port);
      if (fd_ >= 0) break;
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("could not reach the rendezvous at MASTER_ADDR " + host + " MASTER_PORT " +
                                 std::to_string(port) + " within " + std::to_string(timeout.count()) +
                                 " s: is rank 0 running, and is that address reachable from here?");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ~TcpStore() override {
    if (fd_ >= 0) ::close(fd_);
  }
  void set(const std::string& key, const std::vector<char>& data) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_all(fd_, "S", 1);
    write_blob(fd_, key);
    write_blob(fd_, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    write_all(fd_, "G", 1);
    write_blob(fd_, key);
    const std::string v = read_blob(fd_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& k : keys) get(k);
  }

 private:
  static int try_connect(const std::string& host, int port) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
    int fd = -1;
    for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
      fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) ::close(fd), fd = -1;
    }
    freeaddrinfo(res);
    if (fd >= 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
  }

  // Rank 0's table, served to every connection on its own thread for the life of the process (detached: the
  // rendezvous is over once the mesh is connected, and the process's end closes the sockets).
  struct Table {
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::string, std::string> values;
  };
  void start_server(int port) {
    const int listener = ::socket(AF_INET6, SOCK_STREAM, 0);
    if (listener < 0) throw std::runtime_error("rendezvous: no socket for MASTER_PORT");
    const int one = 1, zero = 0;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 clients too
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(uint16_t(port));
    if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listener, 1024) != 0) {
      ::close(listener);
      throw std::runtime_error("rank 0 cannot serve the rendezvous on MASTER_PORT " + std::to_string(port) +
                               " (in use, or not allowed): choose another MASTER_PORT");
    }
    auto table = std::make_shared<Table>();
    std::thread([listener, table] {
      for (;;) {
        const int fd = ::accept(listener, nullptr, nullptr);
        if (fd < 0) return;
        std::thread([fd, table] {
          try {
            for (;;) {
              char op = 0;
              read_all(fd, &op, 1);
              const std::string key = read_blob(fd);
              if (op == 'S') {
                std::string value = read_blob(fd);
                std::lock_guard<std::mutex> lock(table->mu);
                table->values[key] = std::move(value);
                table->cv.notify_all();
              } else if (op == 'G') {
                std::unique_lock<std::mutex> lock(table->mu);
                table->cv.wait(lock, [&] { return table->values.count(key) > 0; });
                const std::string value = table->values[key];
                lock.unlock();
                write_blob(fd, value);
              } else {
                break;
              }
            }
          } catch (const std::exception&) {  // the peer closed: its rendezvous is over
          }
          ::close(fd);
        }).detach();
      }
    }).detach();
  }

  int fd_ = -1;
  std::mutex mu_;
};

class GlooCollectives : public HostCollectives {
 public:
  GlooCollectives(std::shared_ptr<gloo::rendezvous::Context> context, std::unique_ptr<gloo::rendezvous::Store> store)
      : context_(std::move(context)), store_(std::move(store)) {}

  void all_reduce_sum(void* data, size_t count, Kind kind) override {
    if (count == 0) return;
    gloo::AllreduceOptions opts(context_);
    opts.setTag(next_tag());
    switch (kind) {
      case f32:
        opts.setOutput(static_cast<float*>(data), count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        break;
      case f64:
        opts.setOutput(static_cast<double*>(data), count);
        opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
        break;
      case bf16:
        opts.setOutput(static_cast<uint16_t*>(data), count);
        opts.setReduceFunction(&sum_bf16);
        break;
      case f16:
        opts.setOutput(static_cast<gloo::float16*>(data), count);
        opts.setReduceFunction(&sum_f16);
        break;
    }
    gloo::allreduce(opts);
  }

  void broadcast(void* data, size_t bytes, int root) override {
    if (bytes == 0) return;
    gloo::BroadcastOptions opts(context_);
    opts.setTag(next_tag());
    opts.setRoot(root);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    gloo::broadcast(opts);
  }

  void barrier() override {
    gloo::BarrierOptions opts(context_);
    opts.setTag(next_tag());
    gloo::barrier(opts);
  }

 private:
  uint32_t next_tag() { return tag_++; }  // every rank calls the same collectives in the same order
  std::shared_ptr<gloo::rendezvous::Context> context_;
  std::unique_ptr<gloo::rendezvous::Store> store_;  // kept: rank 0's TCP store serves the others until the end
  uint32_t tag_ = 1;
};

}  // namespace

extern "C" HostCollectives* engine_gloo_connect(int rank, int world_size, const char* store_dir, const char* host,
                                                std::string* error) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host && *host ? host : "";
    if (attr.hostname.empty()) {
      char name[256] = {0};
      gethostname(name, sizeof name - 1);
      attr.hostname = name;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    // store_dir: a shared directory (Gloo's file store), or "tcp://HOST:PORT" (MASTER_ADDR and MASTER_PORT).
    const std::string where = store_dir;
    std::unique_ptr<gloo::rendezvous::Store> store;
    if (where.rfind("tcp://", 0) == 0) {
      const size_t colon = where.rfind(':');
      store = std::make_unique<TcpStore>(where.substr(6, colon - 6), std::stoi(where.substr(colon + 1)), rank == 0,
                                         std::chrono::seconds(300));
    } else {
      store = std::make_unique<gloo::rendezvous::FileStore>(where);
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    // Long enough for the slowest rank's step between two collectives on a small machine; a rank that died is
    // noticed sooner by engine_train --nproc, which stops the others.
    context->setTimeout(std::chrono::minutes(10));
    context->connectFullMesh(*store, device);
    return new GlooCollectives(std::move(context), std::move(store));
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
