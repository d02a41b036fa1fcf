// Intel oneCCL collectives (CPU build, shared memory through libfabric's shm provider) with
// oxccl-perf's sizes, timing method, columns and JSON.
//
//   RANK=r SIZE=p KVS_FILE=/tmp/kvs ccl_perf <all_reduce|broadcast|all_gather|reduce_scatter|alltoall>
//            -b MIN -e MAX -f F -n ITERS -w WARMUP -J out.json -L label
//
// Rank 0 creates the key-value store and writes its address to KVS_FILE; the others read it.
// Times are averaged over ranks with a oneCCL all-reduce. Data: float32 small integers,
// checked exactly.
#include <oneapi/ccl.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

// The CPU-only static library expects Intel's ITT tracing hooks; null hooks mean "not
// tracing", which is what the library checks before calling them.
extern "C" {
void* __itt_domain_create_ptr__3_0 = nullptr;
void* __itt_string_handle_create_ptr__3_0 = nullptr;
void* __itt_task_begin_ptr__3_0 = nullptr;
void* __itt_task_end_ptr__3_0 = nullptr;
void* __itt_metadata_add_ptr__3_0 = nullptr;
void* __itt_event_create_ptr__3_0 = nullptr;
void* __itt_event_start_ptr__3_0 = nullptr;
void* __itt_event_end_ptr__3_0 = nullptr;
void* __itt_api_version_ptr__3_0 = nullptr;
void* __itt_thread_set_name_ptr__3_0 = nullptr;
}

#include "perf_common.h"

static void run(coll c, float* s, float* r, size_t param, int p, ccl::communicator& comm) {
  switch (c) {
    case ALL_REDUCE: ccl::allreduce(s, r, param, ccl::reduction::sum, comm).wait(); break;
    case BROADCAST:
      if (comm.rank() == 0) memcpy(r, s, param * 4);
      ccl::broadcast(r, param, 0, comm).wait();
      break;
    case ALL_GATHER: {
      std::vector<size_t> rc(p, param);
      ccl::allgatherv(s, param, r, rc, comm).wait();
      break;
    }
    case REDUCE_SCATTER: ccl::reduce_scatter(s, r, param, ccl::reduction::sum, comm).wait(); break;
    case ALLTOALL: ccl::alltoall(s, r, param, comm).wait(); break;
  }
}

int main(int argc, char** argv) {
  int rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
  int size = atoi(getenv("SIZE") ? getenv("SIZE") : "1");
  std::string kvs_file = getenv("KVS_FILE") ? getenv("KVS_FILE") : "/tmp/ccl-kvs";
  coll c = ALL_REDUCE;
  for (int k = 0; k < 5 && argc > 1; k++)
    if (!strcmp(argv[1], names[k])) c = (coll)k;
  size_t minb = 8, maxb = 64 << 20, factor = 2;
  int iters = 20, warmup = 5;
  const char *json = nullptr, *label = "oneccl";
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "-b") && i + 1 < argc) minb = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "-e") && i + 1 < argc) maxb = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "-f") && i + 1 < argc) factor = atol(argv[++i]);
    else if (!strcmp(argv[i], "-n") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-w") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "-J") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "-L") && i + 1 < argc) label = argv[++i];
  }
  ccl::init();
  ccl::shared_ptr_class<ccl::kvs> kvs;
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    auto addr = kvs->get_address();
    std::string tmp = kvs_file + ".tmp";
    std::ofstream(tmp, std::ios::binary).write((const char*)addr.data(), addr.size());
    std::rename(tmp.c_str(), kvs_file.c_str());
  } else {
    ccl::kvs::address_type addr;
    for (;;) {
      std::ifstream f(kvs_file, std::ios::binary);
      if (f && f.read((char*)addr.data(), addr.size())) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kvs = ccl::create_kvs(addr);
  }
  auto comm = ccl::create_communicator(size, rank, kvs);

  size_t pm, sc, rc;
  counts(c, maxb, size, &pm, &sc, &rc);
  size_t elems = std::max(sc, rc) + 16;
  std::vector<float> s(elems), r(elems);
  FILE* jf = nullptr;
  if (rank == 0 && json) {
    jf = fopen(json, "w");
    fprintf(jf, "{\"label\":\"%s\",\"library\":\"%s\",\"benchmark\":\"%s_perf\",\"nranks\":%d,\"results\":[", label, label, names[c], size);
  }
  if (rank == 0) {
    printf("# %s %s_perf, %d ranks, float sum, out-of-place, %d iterations\n", label, names[c], size, iters);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong");
  }
  int first = 1;
  long errors = 0;
  for (size_t bytes = minb; bytes <= maxb; bytes = factor > 1 ? bytes * factor : bytes + (1 << 20)) {
    size_t param, sendc, recvc;
    counts(c, bytes, size, &param, &sendc, &recvc);
    if (param == 0) continue;
    for (int i = 0; i < warmup; i++) run(c, s.data(), r.data(), param, size, comm);
    ccl::barrier(comm);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; i++) run(c, s.data(), r.data(), param, size, comm);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::vector<double> t(1, dt), tot(1, 0);
    ccl::allreduce(t.data(), tot.data(), 1, ccl::reduction::sum, comm).wait();
    double sec = tot[0] / size;
    for (size_t i = 0; i < sendc; i++) s[i] = val(rank, i);
    run(c, s.data(), r.data(), param, size, comm);
    long wrong = 0;
    size_t out = c == REDUCE_SCATTER ? param : recvc;
    for (size_t i = 0; i < out; i++) {
      float want = want_at(c, size, rank, param, i);
      if (r[i] != want) wrong++;
    }
    errors += wrong != 0;
    double alg, bus;
    bw(c, param, sec, size, &alg, &bus);
    if (rank == 0) out_of_place_row(jf, &first, std::max(sendc, recvc) * 4, param, 0, sec, alg, bus, wrong);
  }
  if (rank == 0) finish_report(jf, errors);
  return errors ? 1 : 0;
}
