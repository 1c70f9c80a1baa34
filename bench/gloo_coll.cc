/*
 * gloo_coll: the same measurement as braid-perf (options, table, JSON and the
 * exact-value check all come from tools/braid-perf/perf_core.c) with Gloo's
 * TCP transport on 127.0.0.1. Gloo has no launcher, so this program forks
 * the ranks itself; they meet through a FileStore in a private mkdtemp()
 * directory that is removed at the end.
 *
 *   build/bench/gloo_coll --ranks 2 allreduce -b 8 -e 64M -f 4 --json
 *
 *   allreduce       gloo::allreduce (new API, the path PyTorch uses); out of
 *                   place and in place; --algo ring (default) or bcube;
 *                   or the legacy classes, in place, f32/f64: --algo
 *                   ring_chunked (AllreduceRingChunked) or halving_doubling
 *                   (AllreduceHalvingDoubling)
 *   broadcast       gloo::broadcast from -r (in place)
 *   allgather       gloo::allgather (out of place)
 *   reduce_scatter  gloo::ReduceScatterHalvingDoubling (the only
 *                   reduce-scatter in this Gloo; in place, block at the start;
 *                   f32/f64)
 *   sendrecv        unbound buffers: send to rank+1, receive from rank-1
 *   barrier         gloo::barrier
 *   reduce          gloo::reduce to -r (out of place)
 *   gather          gloo::gather to -r (out of place)
 *   scatter         gloo::scatter from -r (out of place)
 *   alltoall        gloo::alltoall (out of place)
 *   alltoallv       gloo::alltoallv with the uneven split of perf_a2av_counts
 * Reductions: sum, prod, min, max on f32, f64 and the integer types.
 */
#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/alltoall.h"
#include "gloo/alltoallv.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/config.h"
#include "gloo/gather.h"
#include "gloo/math.h"
#include "gloo/reduce.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/scatter.h"
#include "gloo/transport/tcp/device.h"

#include "perf_core.h"

namespace {

using Ctx = std::shared_ptr<gloo::Context>;
using RedFn = void (*)(void*, const void*, const void*, size_t);

struct Gloo {
  Ctx ctx;
  int rank = 0, n = 1;
  gloo::AllreduceOptions::Algorithm algo = gloo::AllreduceOptions::Algorithm::RING;
  std::string algo_name = "ring";
  int legacy = 0;  // 1: AllreduceRingChunked, 2: AllreduceHalvingDoubling
  std::string err;
  // A legacy all-reduce binds its buffer at construction (collective), as
  // the reduce-scatter below: built for new arguments, then reused.
  std::unique_ptr<gloo::Algorithm> ar;
  const void* ar_ptr = nullptr;
  size_t ar_count = 0;
  int ar_dt = -1, ar_op = -1;
  // Legacy reduce-scatter objects bind their buffer at construction, which is
  // collective: built on the first call with new arguments, then reused.
  std::unique_ptr<gloo::Algorithm> rs;
  const void* rs_ptr = nullptr;
  size_t rs_count = 0;
  int rs_dt = -1, rs_op = -1;
  // Unbound buffers for sendrecv, cached the same way.
  std::unique_ptr<gloo::transport::UnboundBuffer> sb, rb;
  const void *sb_ptr = nullptr, *rb_ptr = nullptr;
  size_t sr_bytes = 0;
  // The all-to-allv split in bytes per rank, for a2av_key bytes per block.
  std::vector<int64_t> a2av_send, a2av_recv;
  size_t a2av_key = static_cast<size_t>(-1);
};

template <typename T>
RedFn red_fn(braid_op op) {
  switch (op) {
    case BRAID_SUM: return static_cast<RedFn>(&gloo::sum<T>);
    case BRAID_PROD: return static_cast<RedFn>(&gloo::product<T>);
    case BRAID_MIN: return static_cast<RedFn>(&gloo::min<T>);
    case BRAID_MAX: return static_cast<RedFn>(&gloo::max<T>);
    default: return nullptr;
  }
}

template <typename T>
void reduce_t(Gloo& g, const void* send, void* recv, size_t count, braid_op op, int root) {
  gloo::ReduceOptions o(g.ctx);
  o.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
  o.setOutput(static_cast<T*>(recv), count);
  o.setRoot(root);
  o.setReduceFunction(red_fn<T>(op));
  o.setTag(15);
  gloo::reduce(o);
}

void reduce(Gloo& g, const void* s, void* r, size_t c, braid_dtype dt, braid_op op, int root) {
  switch (dt) {
    case BRAID_F32: reduce_t<float>(g, s, r, c, op, root); break;
    case BRAID_F64: reduce_t<double>(g, s, r, c, op, root); break;
    case BRAID_I64: reduce_t<int64_t>(g, s, r, c, op, root); break;
    case BRAID_I32: reduce_t<int32_t>(g, s, r, c, op, root); break;
    case BRAID_I16: reduce_t<int16_t>(g, s, r, c, op, root); break;
    case BRAID_I8: reduce_t<int8_t>(g, s, r, c, op, root); break;
    case BRAID_U64: reduce_t<uint64_t>(g, s, r, c, op, root); break;
    case BRAID_U32: reduce_t<uint32_t>(g, s, r, c, op, root); break;
    case BRAID_U16: reduce_t<uint16_t>(g, s, r, c, op, root); break;
    case BRAID_U8: reduce_t<uint8_t>(g, s, r, c, op, root); break;
    default: throw std::runtime_error("unsupported dtype");
  }
}

template <typename T>
const gloo::ReductionFunction<T>* legacy_fn(braid_op op) {
  switch (op) {
    case BRAID_SUM: return gloo::ReductionFunction<T>::sum;
    case BRAID_PROD: return gloo::ReductionFunction<T>::product;
    case BRAID_MIN: return gloo::ReductionFunction<T>::min;
    default: return gloo::ReductionFunction<T>::max;
  }
}

bool typed_reduction(braid_dtype dt) {
  switch (dt) {
    case BRAID_F32: case BRAID_F64: case BRAID_I64: case BRAID_I32: case BRAID_I16: case BRAID_I8:
    case BRAID_U64: case BRAID_U32: case BRAID_U16: case BRAID_U8: return true;
    default: return false;
  }
}

template <typename T>
void allreduce_t(Gloo& g, const void* send, void* recv, size_t count, braid_op op, int inplace) {
  gloo::AllreduceOptions o(g.ctx);
  o.setAlgorithm(g.algo);
  if (!inplace) o.setInput(const_cast<T*>(static_cast<const T*>(send)), count);
  o.setOutput(static_cast<T*>(recv), count);  // without an input, the output is the input
  o.setReduceFunction(red_fn<T>(op));
  o.setTag(11);
  gloo::allreduce(o);
}

template <typename T>
void allreduce_legacy_t(Gloo& g, void* buf, size_t count, braid_dtype dt, braid_op op) {
  if (count > static_cast<size_t>(INT_MAX))
    throw std::runtime_error("the legacy all-reduce counts elements in int: size too large");
  if (!g.ar || g.ar_ptr != buf || g.ar_count != count || g.ar_dt != dt || g.ar_op != op) {
    g.ar.reset();
    std::vector<T*> ptrs{static_cast<T*>(buf)};
    const int n = static_cast<int>(count);
    if (g.legacy == 1) g.ar.reset(new gloo::AllreduceRingChunked<T>(g.ctx, ptrs, n, legacy_fn<T>(op)));
    else g.ar.reset(new gloo::AllreduceHalvingDoubling<T>(g.ctx, ptrs, n, legacy_fn<T>(op)));
    g.ar_ptr = buf;
    g.ar_count = count;
    g.ar_dt = dt;
    g.ar_op = op;
  }
  g.ar->run();
}

void allreduce(Gloo& g, const void* s, void* r, size_t c, braid_dtype dt, braid_op op, int ip) {
  if (g.legacy) {  // in place only (g_placements)
    if (dt == BRAID_F64) allreduce_legacy_t<double>(g, r, c, dt, op);
    else allreduce_legacy_t<float>(g, r, c, dt, op);
    return;
  }
  switch (dt) {
    case BRAID_F32: allreduce_t<float>(g, s, r, c, op, ip); break;
    case BRAID_F64: allreduce_t<double>(g, s, r, c, op, ip); break;
    case BRAID_I64: allreduce_t<int64_t>(g, s, r, c, op, ip); break;
    case BRAID_I32: allreduce_t<int32_t>(g, s, r, c, op, ip); break;
    case BRAID_I16: allreduce_t<int16_t>(g, s, r, c, op, ip); break;
    case BRAID_I8: allreduce_t<int8_t>(g, s, r, c, op, ip); break;
    case BRAID_U64: allreduce_t<uint64_t>(g, s, r, c, op, ip); break;
    case BRAID_U32: allreduce_t<uint32_t>(g, s, r, c, op, ip); break;
    case BRAID_U16: allreduce_t<uint16_t>(g, s, r, c, op, ip); break;
    case BRAID_U8: allreduce_t<uint8_t>(g, s, r, c, op, ip); break;
    default: throw std::runtime_error("unsupported dtype");
  }
}

template <typename T>
void reduce_scatter_t(Gloo& g, const void* buf, size_t count, braid_dtype dt, braid_op op) {
  // The legacy algorithm counts elements in int; a larger -e must fail loudly.
  if (count > static_cast<size_t>(INT_MAX) / static_cast<size_t>(g.n))
    throw std::runtime_error("ReduceScatterHalvingDoubling counts elements in int: size too large");
  if (!g.rs || g.rs_ptr != buf || g.rs_count != count || g.rs_dt != dt || g.rs_op != op) {
    g.rs.reset();
    std::vector<T*> ptrs{static_cast<T*>(const_cast<void*>(buf))};
    std::vector<int> recv(g.n, static_cast<int>(count));
    g.rs.reset(new gloo::ReduceScatterHalvingDoubling<T>(g.ctx, ptrs, static_cast<int>(count * g.n), recv,
                                                          legacy_fn<T>(op)));
    g.rs_ptr = buf;
    g.rs_count = count;
    g.rs_dt = dt;
    g.rs_op = op;
  }
  g.rs->run();
}

void sendrecv(Gloo& g, const void* send, void* recv, size_t bytes) {
  if (g.n == 1) {  // no pair to oneself in Gloo: the exchange is a copy
    memcpy(recv, send, bytes);
    return;
  }
  if (!g.sb || g.sb_ptr != send || g.rb_ptr != recv || g.sr_bytes != bytes) {
    g.sb = g.ctx->createUnboundBuffer(const_cast<void*>(send), bytes);
    g.rb = g.ctx->createUnboundBuffer(recv, bytes);
    g.sb_ptr = send;
    g.rb_ptr = recv;
    g.sr_bytes = bytes;
  }
  const uint64_t slot = (0x5eull << 56) | 1;
  g.rb->recv((g.rank - 1 + g.n) % g.n, slot);
  g.sb->send((g.rank + 1) % g.n, slot);
  g.sb->waitSend();
  g.rb->waitRecv();
}

void alltoallv(Gloo& g, const void* send, void* recv, size_t count, size_t esz) {
  if (g.a2av_key != count * esz) {
    std::vector<size_t> v(4 * static_cast<size_t>(g.n));
    perf_a2av_counts(g.rank, g.n, count, v.data(), v.data() + g.n, v.data() + 2 * g.n, v.data() + 3 * g.n);
    g.a2av_send.assign(g.n, 0);
    g.a2av_recv.assign(g.n, 0);
    for (int j = 0; j < g.n; j++) {
      g.a2av_send[j] = static_cast<int64_t>(v[j] * esz);
      g.a2av_recv[j] = static_cast<int64_t>(v[2 * g.n + j] * esz);
    }
    g.a2av_key = count * esz;
  }
  gloo::AlltoallvOptions o(g.ctx);
  o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), g.a2av_send);
  o.setOutput(static_cast<uint8_t*>(recv), g.a2av_recv);
  o.setTag(19);
  gloo::alltoallv(o);
}

extern "C" unsigned g_placements(void* p, perf_op op) {
  switch (op) {
    case PERF_ALLREDUCE: return static_cast<Gloo*>(p)->legacy ? PERF_INPLACE : PERF_OOP | PERF_INPLACE;
    case PERF_BROADCAST:
    case PERF_REDUCE_SCATTER: return PERF_INPLACE;
    default: return PERF_OOP;
  }
}

extern "C" const char* g_unsupported(void* p, perf_op op, braid_dtype dt, braid_op rop) {
  static char why[160];
  if (op != PERF_ALLREDUCE && op != PERF_REDUCE_SCATTER && op != PERF_REDUCE) return nullptr;
  bool legacy = op == PERF_REDUCE_SCATTER || (op == PERF_ALLREDUCE && static_cast<Gloo*>(p)->legacy);
  bool type_ok = !legacy ? typed_reduction(dt) : (dt == BRAID_F32 || dt == BRAID_F64);
  if (!type_ok) {
    snprintf(why, sizeof why, "gloo_coll has no %s %s", perf_op_name(op), perf_dtype_name(dt));
    return why;
  }
  if (rop != BRAID_SUM && rop != BRAID_PROD && rop != BRAID_MIN && rop != BRAID_MAX) {
    snprintf(why, sizeof why, "Gloo has no %s reduction", perf_redop_name(rop));
    return why;
  }
  return nullptr;
}

extern "C" int g_run(void* p, perf_op op, const void* send, void* recv, size_t count, braid_dtype dt,
                     braid_op rop, int root, int inplace) {
  Gloo& g = *static_cast<Gloo*>(p);
  const size_t bytes = count * perf_dtype_size(dt);
  try {
    switch (op) {
      case PERF_ALLREDUCE: allreduce(g, send, recv, count, dt, rop, inplace); break;
      case PERF_BROADCAST: {
        gloo::BroadcastOptions o(g.ctx);
        o.setOutput(static_cast<uint8_t*>(recv), bytes);
        o.setRoot(root);
        o.setTag(12);
        gloo::broadcast(o);
        break;
      }
      case PERF_ALLGATHER: {
        // In place (used for the header only): Gloo wants a separate input.
        std::vector<uint8_t> tmp;
        const void* in = send;
        if (inplace) {
          tmp.assign(static_cast<const uint8_t*>(send), static_cast<const uint8_t*>(send) + bytes);
          in = tmp.data();
        }
        gloo::AllgatherOptions o(g.ctx);
        o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), bytes);
        o.setOutput(static_cast<uint8_t*>(recv), bytes * g.n);
        o.setTag(13);
        gloo::allgather(o);
        break;
      }
      case PERF_REDUCE_SCATTER:
        if (dt == BRAID_F64) reduce_scatter_t<double>(g, send, count, dt, rop);
        else reduce_scatter_t<float>(g, send, count, dt, rop);
        break;
      case PERF_SENDRECV: sendrecv(g, send, recv, bytes); break;
      case PERF_BARRIER: {
        gloo::BarrierOptions o(g.ctx);
        o.setTag(14);
        gloo::barrier(o);
        break;
      }
      case PERF_REDUCE: reduce(g, send, recv, count, dt, rop, root); break;
      case PERF_GATHER: {
        gloo::GatherOptions o(g.ctx);
        o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes);
        if (g.rank == root) o.setOutput(static_cast<uint8_t*>(recv), bytes * g.n);
        o.setRoot(root);
        o.setTag(16);
        gloo::gather(o);
        break;
      }
      case PERF_SCATTER: {
        gloo::ScatterOptions o(g.ctx);
        std::vector<uint8_t*> in;
        if (g.rank == root) {
          for (int q = 0; q < g.n; q++)
            in.push_back(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)) + static_cast<size_t>(q) * bytes);
          o.setInputs(in, bytes);
        }
        o.setOutput(static_cast<uint8_t*>(recv), bytes);
        o.setRoot(root);
        o.setTag(17);
        gloo::scatter(o);
        break;
      }
      case PERF_ALLTOALL: {
        gloo::AlltoallOptions o(g.ctx);
        o.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes * g.n);
        o.setOutput(static_cast<uint8_t*>(recv), bytes * g.n);
        o.setTag(18);
        gloo::alltoall(o);
        break;
      }
      case PERF_ALLTOALLV: alltoallv(g, send, recv, count, perf_dtype_size(dt)); break;
      default: return -1;
    }
  } catch (const std::exception& e) {
    g.err = std::string(perf_op_name(op)) + ": " + e.what();
    return -1;
  }
  return 0;
}

extern "C" int g_complete(void*) { return 0; }  // every call above blocks until done

extern "C" int g_barrier(void* p) { return g_run(p, PERF_BARRIER, nullptr, nullptr, 0, BRAID_U8, BRAID_SUM, 0, 0); }

extern "C" const char* g_last_error(void* p) { return static_cast<Gloo*>(p)->err.c_str(); }

extern "C" void g_describe(void* p, perf_op op, FILE* out) {
  Gloo& g = *static_cast<Gloo*>(p);
  switch (op) {
    case PERF_ALLREDUCE:
      if (g.legacy) fprintf(out, "# algorithm: gloo::%s (legacy class), every size\n",
                            g.legacy == 1 ? "AllreduceRingChunked" : "AllreduceHalvingDoubling");
      else fprintf(out, "# algorithm: gloo::allreduce %s (new API), every size\n", g.algo_name.c_str());
      break;
    case PERF_REDUCE_SCATTER:
      fprintf(out, "# algorithm: gloo::ReduceScatterHalvingDoubling, every size\n");
      break;
    default: fprintf(out, "# algorithm: gloo::%s (new API)\n", perf_op_name(op)); break;
  }
  fprintf(out, "# transport: Gloo TCP over 127.0.0.1, one device thread per rank\n");
}

int rank_main(int rank, int n, const std::string& dir, const Gloo& proto, perf_args& a, const char* label) {
  Gloo g;
  g.rank = rank;
  g.n = n;
  g.algo = proto.algo;
  g.algo_name = proto.algo_name;
  g.legacy = proto.legacy;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";  // loopback only
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fstore(dir);
  gloo::rendezvous::PrefixStore store("gloo_coll", fstore);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  rctx->setTimeout(std::chrono::seconds(300));
  rctx->connectFullMesh(store, dev);
  g.ctx = rctx;

  char lib[64];
  snprintf(lib, sizeof lib, "Gloo %d.%d.%d", GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH);
  perf_layer L{};
  L.backend = label;
  L.library = lib;
  L.rank = rank;
  L.nranks = n;
  L.ctx = &g;
  L.placements = g_placements;
  L.unsupported = g_unsupported;
  L.run = g_run;
  L.complete = g_complete;
  L.barrier = g_barrier;
  L.last_error = g_last_error;
  L.describe = g_describe;
  L.rs_inplace_result_at_start = 1;
  int rc = perf_run(&a, &L);
  g_barrier(&g);  // nobody closes its sockets while a peer still reads
  g.rs.reset();
  g.ar.reset();
  g.sb.reset();
  g.rb.reset();
  return rc;
}

void rm_tree(const std::string& dir) {
  if (DIR* d = opendir(dir.c_str())) {
    while (struct dirent* e = readdir(d)) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      std::string p = dir + "/" + e->d_name;
      struct stat st;
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) rm_tree(p);
      else unlink(p.c_str());
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

std::vector<pid_t> g_children;
std::string g_dir;

// Forward SIGTERM/SIGINT to the ranks this process started, then clean up.
void on_term(int sig) {
  for (pid_t p : g_children)
    if (p > 0) kill(p, SIGTERM);
  for (pid_t p : g_children)
    if (p > 0) waitpid(p, nullptr, 0);
  if (!g_dir.empty()) rm_tree(g_dir);
  _exit(128 + sig);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 2;
  Gloo proto;
  const char* label = getenv("BRAID_PERF_LABEL");
  if (!label || !*label) label = "gloo-tcp";
  std::vector<char*> av;
  for (int i = 0; i < argc; i++) {
    std::string s = argv[i];
    auto value = [&](const char* name) -> const char* {
      size_t l = strlen(name);
      if (s == name && i + 1 < argc) return argv[++i];
      if (s.compare(0, l + 1, std::string(name) + "=") == 0) return argv[i] + l + 1;
      return nullptr;
    };
    if (const char* v = value("--ranks")) {
      char* end;
      long x = strtol(v, &end, 10);
      if (*end || x < 1 || x > 256) {
        fprintf(stderr, "gloo_coll: invalid value '%s' for --ranks: expected 1..256\n", v);
        return PERF_EXIT_USAGE;
      }
      n = static_cast<int>(x);
    } else if (const char* v2 = value("--algo")) {
      proto.algo_name = v2;
      if (proto.algo_name == "ring") proto.algo = gloo::AllreduceOptions::Algorithm::RING;
      else if (proto.algo_name == "bcube") proto.algo = gloo::AllreduceOptions::Algorithm::BCUBE;
      else if (proto.algo_name == "ring_chunked") proto.legacy = 1;
      else if (proto.algo_name == "halving_doubling") proto.legacy = 2;
      else {
        fprintf(stderr,
                "gloo_coll: invalid value '%s' for --algo: expected ring, bcube, ring_chunked or halving_doubling\n",
                v2);
        return PERF_EXIT_USAGE;
      }
    } else if (const char* v3 = value("--label")) {
      label = v3;
    } else {
      av.push_back(argv[i]);
    }
  }
  av.push_back(nullptr);
  perf_args a;
  int rc = perf_parse_args(static_cast<int>(av.size()) - 1, av.data(), &a, "gloo_coll", 0);
  if (rc >= 0) {
    if (rc == 0) printf("gloo_coll only: --ranks N (default 2), --algo ring|bcube|ring_chunked|halving_doubling, --label NAME\n");
    return rc;
  }
  char tmpl[] = "/tmp/gloo_coll.XXXXXX";
  if (!mkdtemp(tmpl)) {
    perror("gloo_coll: mkdtemp");
    return PERF_EXIT_ERROR;
  }
  g_dir = tmpl;
  g_children.assign(n, 0);
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p < 0) {
      perror("gloo_coll: fork");
      on_term(SIGTERM);
    }
    if (p == 0) {
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      int code = PERF_EXIT_ERROR;
      try {
        code = rank_main(r, n, g_dir, proto, a, label);
      } catch (const std::exception& e) {
        fprintf(stderr, "gloo_coll (rank %d): %s\n", r, e.what());
      }
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    g_children[r] = p;
  }
  int worst = 0;
  for (int r = 0; r < n; r++) {
    int st = 0;
    waitpid(g_children[r], &st, 0);
    g_children[r] = 0;  // reaped: never signal this pid again
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    if (code && code != PERF_EXIT_WRONG && !worst) {
      // One rank failed: stop the ranks not reaped yet (pids still ours).
      for (int k = r + 1; k < n; k++) kill(g_children[k], SIGTERM);
    }
    if (code > worst) worst = code;
  }
  rm_tree(g_dir);
  return worst;
}
