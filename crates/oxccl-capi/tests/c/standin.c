/* A stand-in for another libnccl.so.2 (NVIDIA's, say): the same soname and symbols, each
 * call failing. A program linked against it runs on oxccl only if the loader binds it to
 * oxccl's library instead. */
#include "nccl.h"

#define FAIL { return ncclInternalError; }

const char* ncclGetErrorString(ncclResult_t r) { (void)r; return "stand-in library: not oxccl"; }
const char* ncclGetLastError(ncclComm_t c) { (void)c; return "stand-in library"; }
ncclResult_t ncclGetVersion(int* v) { (void)v; FAIL }
ncclResult_t ncclGetUniqueId(ncclUniqueId* u) { (void)u; FAIL }
ncclResult_t ncclCommInitRank(ncclComm_t* c, int n, ncclUniqueId u, int r) { (void)c; (void)n; (void)u; (void)r; FAIL }
ncclResult_t ncclCommInitRankConfig(ncclComm_t* c, int n, ncclUniqueId u, int r, ncclConfig_t* k) { (void)c; (void)n; (void)u; (void)r; (void)k; FAIL }
ncclResult_t ncclCommCount(const ncclComm_t c, int* n) { (void)c; (void)n; FAIL }
ncclResult_t ncclCommUserRank(const ncclComm_t c, int* n) { (void)c; (void)n; FAIL }
ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* n) { (void)c; (void)n; FAIL }
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* e) { (void)c; (void)e; FAIL }
ncclResult_t ncclCommFinalize(ncclComm_t c) { (void)c; FAIL }
ncclResult_t ncclCommDestroy(ncclComm_t c) { (void)c; FAIL }
ncclResult_t ncclCommAbort(ncclComm_t c) { (void)c; FAIL }
ncclResult_t ncclCommSplit(ncclComm_t c, int a, int b, ncclComm_t* n, ncclConfig_t* k) { (void)c; (void)a; (void)b; (void)n; (void)k; FAIL }
ncclResult_t ncclCommShrink(ncclComm_t c, int* l, int n, ncclComm_t* o, ncclConfig_t* k, int f) { (void)c; (void)l; (void)n; (void)o; (void)k; (void)f; FAIL }
ncclResult_t ncclAllReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)o; (void)c; (void)st; FAIL }
ncclResult_t ncclBroadcast(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; FAIL }
ncclResult_t ncclBcast(void* b, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) { (void)b; (void)n; (void)t; (void)root; (void)c; (void)st; FAIL }
ncclResult_t ncclReduce(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o, int root, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)o; (void)root; (void)c; (void)st; FAIL }
ncclResult_t ncclAllGather(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; FAIL }
ncclResult_t ncclReduceScatter(const void* s, void* r, size_t n, ncclDataType_t t, ncclRedOp_t o, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)o; (void)c; (void)st; FAIL }
ncclResult_t ncclAlltoAll(const void* s, void* r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)c; (void)st; FAIL }
ncclResult_t ncclGather(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; FAIL }
ncclResult_t ncclScatter(const void* s, void* r, size_t n, ncclDataType_t t, int root, ncclComm_t c, cudaStream_t st) { (void)s; (void)r; (void)n; (void)t; (void)root; (void)c; (void)st; FAIL }
ncclResult_t ncclSend(const void* s, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t st) { (void)s; (void)n; (void)t; (void)p; (void)c; (void)st; FAIL }
ncclResult_t ncclRecv(void* r, size_t n, ncclDataType_t t, int p, ncclComm_t c, cudaStream_t st) { (void)r; (void)n; (void)t; (void)p; (void)c; (void)st; FAIL }
ncclResult_t ncclGroupStart(void) FAIL
ncclResult_t ncclGroupEnd(void) FAIL
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* s) { (void)s; FAIL }
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* o, void* s, ncclDataType_t t, ncclScalarResidence_t r, ncclComm_t c) { (void)o; (void)s; (void)t; (void)r; (void)c; FAIL }
ncclResult_t ncclRedOpDestroy(ncclRedOp_t o, ncclComm_t c) { (void)o; (void)c; FAIL }
ncclResult_t ncclMemAlloc(void** p, size_t n) { (void)p; (void)n; FAIL }
ncclResult_t ncclMemFree(void* p) { (void)p; FAIL }
ncclResult_t ncclCommRegister(const ncclComm_t c, void* b, size_t n, void** h) { (void)c; (void)b; (void)n; (void)h; FAIL }
ncclResult_t ncclCommDeregister(const ncclComm_t c, void* h) { (void)c; (void)h; FAIL }
ncclResult_t ncclCommWindowRegister(ncclComm_t c, void* b, size_t n, ncclWindow_t* w, int f) { (void)c; (void)b; (void)n; (void)w; (void)f; FAIL }
ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t w) { (void)c; (void)w; FAIL }
ncclResult_t ncclDevCommCreate(ncclComm_t c, const ncclDevCommRequirements_t* r, ncclDevComm_t* d) { (void)c; (void)r; (void)d; FAIL }
