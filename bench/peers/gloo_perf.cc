// Gloo all-reduce (ring, TCP) with oxccl-perf's sizes, timing method, columns and JSON.
//
//   RANK=r SIZE=p STORE=/tmp/dir gloo_perf all_reduce -b MIN -e MAX -f F -n ITERS -J out.json
//
// Ranks meet through a file store; the TCP device binds 127.0.0.1. Times are averaged over
// ranks through a second all-reduce. Data: float32 small integers, checked exactly.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "perf_common.h"

static void allreduce(std::shared_ptr<gloo::Context> ctx, float* in, float* out, size_t n) {
  gloo::AllreduceOptions o(ctx);
  o.setInput(in, n);
  o.setOutput(out, n);
  o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
  gloo::allreduce(o);
}

int main(int argc, char** argv) {
  int rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
  int size = atoi(getenv("SIZE") ? getenv("SIZE") : "1");
  const char* store_dir = getenv("STORE") ? getenv("STORE") : "/tmp";
  size_t minb = 8, maxb = 64 << 20, factor = 2;
  int iters = 20, warmup = 5;
  const char *json = nullptr, *label = "gloo-tcp";
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "-b") && i + 1 < argc) minb = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "-e") && i + 1 < argc) maxb = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "-f") && i + 1 < argc) factor = atol(argv[++i]);
    else if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-w") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-J") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "-L") && i + 1 < argc) label = argv[++i];
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(store_dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->connectFullMesh(store, dev);

  size_t n_max = maxb / 4 + 16;
  std::vector<float> s(n_max), r(n_max);
  FILE* jf = nullptr;
  if (rank == 0 && json) {
    jf = fopen(json, "w");
    fprintf(jf, "{\"label\":\"%s\",\"library\":\"%s\",\"benchmark\":\"all_reduce_perf\",\"nranks\":%d,\"results\":[", label, label, size);
  }
  if (rank == 0) {
    printf("# %s all_reduce_perf, %d ranks, float sum, out-of-place, %d iterations\n", label, size, iters);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong");
  }
  int first = 1;
  long errors = 0;
  for (size_t bytes = minb; bytes <= maxb; bytes = factor > 1 ? bytes * factor : bytes + (1 << 20)) {
    size_t n = bytes / 4;
    if (n == 0) continue;
    for (int i = 0; i < warmup; i++) allreduce(ctx, s.data(), r.data(), n);
    gloo::BarrierOptions bo(ctx);
    gloo::barrier(bo);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) allreduce(ctx, s.data(), r.data(), n);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    double sum = dt;
    {
      std::vector<double> t(1, dt), tot(1, 0);
      gloo::AllreduceOptions o(ctx);
      o.setInput(t.data(), 1);
      o.setOutput(tot.data(), 1);
      o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
      gloo::allreduce(o);
      sum = tot[0];
    }
    double sec = sum / size;
    for (size_t i = 0; i < n; i++) s[i] = val(rank, i);
    allreduce(ctx, s.data(), r.data(), n);
    long wrong = 0;
    for (size_t i = 0; i < n; i++) {
      float want = 0;
      for (int q = 0; q < size; q++) want += val(q, i);
      if (r[i] != want) wrong++;
    }
    errors += wrong != 0;
    double alg = (double)bytes / 1e9 / sec, bus = alg * 2.0 * (size - 1) / size;
    if (rank == 0) out_of_place_row(jf, &first, n * 4, n, -1, sec, alg, bus, wrong);
  }
  if (rank == 0) finish_report(jf, errors);
  return errors ? 1 : 0;
}
