/* nccl.h for oxccl's libnccl.so.2.
 *
 * The host API of NCCL 2.30.7 (the version PyTorch 2.15 ships with): the same function
 * names and signatures, enum values and struct layouts, so a program compiled against
 * NVIDIA's header runs on oxccl and one compiled against this header runs on NVIDIA's
 * library. Written for oxccl from NCCL's published API; see docs/capi.md for what each
 * call does on oxccl (host memory completes before the call returns, whatever the stream).
 *
 * This header needs no CUDA installation: it declares cudaStream_t itself, as the CUDA
 * runtime does, unless the CUDA runtime header was included first.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#if defined(OXCCL_NCCL_INCLUDE_CUDA)
#include <cuda_runtime.h>
#endif
#if !defined(__CUDA_RUNTIME_API_H__) && !defined(__DRIVER_TYPES_H__)
typedef struct CUstream_st* cudaStream_t;
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 7
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 23007
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

/* oxccl identifies itself (NCCL_VERSION_CODE is the API level it implements). */
#define OXCCL_NCCL_ABI 1

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
typedef struct ncclWindow_vidmem* ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

#define NCCL_API_MAGIC 0xcafebeef

/* Window registration flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
/* Windows start on this boundary (ncclMemAlloc's memory does). */
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* CTA policies (GPU only; accepted and ignored for host memory). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags (none yet: pass 0). */
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclCommSuspend flags. */
#define NCCL_SUSPEND_MEM 0x01 /* release the memory the communicator can rebuild */

/* Communicator settings. Start from NCCL_CONFIG_INITIALIZER, then set fields. */
typedef struct ncclConfig_v23000 {
  size_t size;          /* set by the initializer */
  unsigned int magic;   /* set by the initializer */
  unsigned int version; /* set by the initializer */
  int blocking;         /* 1 (default): init blocks; 0: init returns ncclInProgress */
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;  /* NULL or "Socket" */
  int splitShare;
  int trafficClass;
  const char* commName; /* shown in oxccl's log lines */
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;      /* fields below: NCCL 2.30 (a 2.28 struct ends above: see size) */
  int numRmaCtx;           /* ctx values of ncclPutSignal/ncclSignal: 0..numRmaCtx-1 (1) */
  int maxP2pPeers;
  int graphStreamOrdering;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                                              \
  {                                                                                          \
    sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, NCCL_CONFIG_UNDEF_INT,          \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_PTR, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,                 \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT                                         \
  }

/* What ncclGroupSimulateEnd reports. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime; /* microseconds; NCCL_UNDEF_FLOAT when not estimated */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5, /* the first value ncclRedOpCreatePreMulSum hands out */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclScalarDevice = 0,       /* read when the collective runs */
  ncclScalarHostImmediate = 1 /* read before ncclRedOpCreatePreMulSum returns */
} ncclScalarResidence_t;

/* What ncclCommMemStats reports (bytes, except ncclStatGpuMemSuspended: 0 or 1). On
 * oxccl "GPU memory" is the memory a communicator holds for its own use: shared-memory
 * connections, staging and device-engine buffers. */
typedef enum {
  ncclStatGpuMemSuspend = 0,   /* released by ncclCommSuspend(NCCL_SUSPEND_MEM) */
  ncclStatGpuMemSuspended = 1, /* 1 while suspended */
  ncclStatGpuMemPersist = 2,   /* held until the communicator ends */
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

/* ncclWaitSignal: wait for opCnt signals from peer on (sigIdx, ctx). */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

/* Parameters (NCCL_* and OXCCL_* settings), read by key. */
typedef struct ncclParamHandle* ncclParamHandle_t;

/* The device API's types (nccl_device.h): opaque here, oxccl does not offer it. */
typedef struct ncclDevCommRequirements ncclDevCommRequirements_t;
typedef struct ncclDevComm ncclDevComm_t;

/* Every function exists as ncclX and as its profiling alias pncclX. */
#define OXCCL_NCCL_API(ret, name, args) \
  ret name args;                        \
  ret p##name args

OXCCL_NCCL_API(ncclResult_t, ncclMemAlloc, (void** ptr, size_t size));
OXCCL_NCCL_API(ncclResult_t, ncclMemFree, (void* ptr));
OXCCL_NCCL_API(ncclResult_t, ncclGetVersion, (int* version));
OXCCL_NCCL_API(ncclResult_t, ncclGetUniqueId, (ncclUniqueId * uniqueId));
OXCCL_NCCL_API(ncclResult_t, ncclCommInitRankConfig,
               (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config));
OXCCL_NCCL_API(ncclResult_t, ncclCommInitRank,
               (ncclComm_t * comm, int nranks, ncclUniqueId commId, int rank));
OXCCL_NCCL_API(ncclResult_t, ncclCommInitAll, (ncclComm_t * comm, int ndev, const int* devlist));
OXCCL_NCCL_API(ncclResult_t, ncclCommInitRankScalable,
               (ncclComm_t * newcomm, int nranks, int myrank, int nId, ncclUniqueId* commIds,
                ncclConfig_t* config));
OXCCL_NCCL_API(ncclResult_t, ncclCommFinalize, (ncclComm_t comm));
OXCCL_NCCL_API(ncclResult_t, ncclCommDestroy, (ncclComm_t comm));
OXCCL_NCCL_API(ncclResult_t, ncclCommAbort, (ncclComm_t comm));
OXCCL_NCCL_API(ncclResult_t, ncclCommSplit,
               (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config));
OXCCL_NCCL_API(ncclResult_t, ncclCommShrink,
               (ncclComm_t comm, int* excludeRanksList, int excludeRanksCount, ncclComm_t* newcomm,
                ncclConfig_t* config, int shrinkFlags));
OXCCL_NCCL_API(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags));
OXCCL_NCCL_API(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId* uniqueId));
/* Existing non-root ranks: (comm, n, NULL, -1); the existing rank that made the id with
 * ncclCommGetUniqueId: (comm, n, &id, -1); new ranks: (NULL, n, &id, their rank). */
OXCCL_NCCL_API(ncclResult_t, ncclCommGrow,
               (ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                ncclComm_t* newcomm, ncclConfig_t* config));
OXCCL_NCCL_API(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags));
OXCCL_NCCL_API(ncclResult_t, ncclCommResume, (ncclComm_t comm));
OXCCL_NCCL_API(ncclResult_t, ncclCommMemStats,
               (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value));
OXCCL_NCCL_API(const char*, ncclGetErrorString, (ncclResult_t result));
OXCCL_NCCL_API(const char*, ncclGetLastError, (ncclComm_t comm));
OXCCL_NCCL_API(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * asyncError));
OXCCL_NCCL_API(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int* count));
OXCCL_NCCL_API(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int* device));
OXCCL_NCCL_API(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int* rank));
OXCCL_NCCL_API(ncclResult_t, ncclCommRegister,
               (const ncclComm_t comm, void* buff, size_t size, void** handle));
OXCCL_NCCL_API(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void* handle));
OXCCL_NCCL_API(ncclResult_t, ncclCommWindowRegister,
               (ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags));
OXCCL_NCCL_API(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win));
OXCCL_NCCL_API(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t comm, ncclWindow_t win, void** outUserPtr));
OXCCL_NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum,
               (ncclRedOp_t * op, void* scalar, ncclDataType_t datatype,
                ncclScalarResidence_t residence, ncclComm_t comm));
OXCCL_NCCL_API(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm));

/* Collectives. In place: sendbuff == recvbuff (AllGather: sendbuff == recvbuff + rank *
 * sendcount; ReduceScatter: recvbuff == sendbuff + rank * recvcount; Gather on the root:
 * sendbuff == recvbuff + root * count; Scatter on the root: recvbuff == sendbuff + root *
 * count). Any other overlap of the two buffers is refused with ncclInvalidArgument. */
OXCCL_NCCL_API(ncclResult_t, ncclReduce,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclBcast,
               (void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclBroadcast,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclAllReduce,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclReduceScatter,
               (const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclAllGather,
               (const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclAlltoAll,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclGather,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclScatter,
               (const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                int root, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclSend,
               (const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclRecv,
               (void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                cudaStream_t stream));

/* One-sided calls on windows registered (ncclCommWindowRegister) by every rank in the same
 * order: peerWin is the caller's own handle of that window, and the data lands at
 * peerWinOffset in the peer's. ctx is below config->numRmaCtx; flags must be 0. */
OXCCL_NCCL_API(ncclResult_t, ncclPutSignal,
               (const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                unsigned int flags, ncclComm_t comm, cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclSignal,
               (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                cudaStream_t stream));
OXCCL_NCCL_API(ncclResult_t, ncclWaitSignal,
               (int nDesc, ncclWaitSignalDesc_t* signalDescs, ncclComm_t comm, cudaStream_t stream));

OXCCL_NCCL_API(ncclResult_t, ncclGroupStart, (void));
OXCCL_NCCL_API(ncclResult_t, ncclGroupEnd, (void));
OXCCL_NCCL_API(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t * simInfo));

/* The device API: answers ncclInvalidUsage ("not supported" in ncclGetLastError). */
OXCCL_NCCL_API(ncclResult_t, ncclDevCommCreate,
               (ncclComm_t comm, const ncclDevCommRequirements_t* reqs, ncclDevComm_t* outDevComm));
OXCCL_NCCL_API(ncclResult_t, ncclDevCommDestroy, (ncclComm_t comm, const ncclDevComm_t* devComm));
/* Device pointers of a window's peers (nccl_device.h): NULL with ncclSuccess where no
 * device mapping exists, as NCCL answers without the device API. */
OXCCL_NCCL_API(ncclResult_t, ncclGetPeerDevicePointer,
               (ncclWindow_t window, size_t offset, int peer, void** outPtr));
OXCCL_NCCL_API(ncclResult_t, ncclGetLsaDevicePointer,
               (ncclWindow_t window, size_t offset, int lsaRank, void** outPtr));
OXCCL_NCCL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer,
               (ncclWindow_t window, size_t offset, void** outPtr));

/* Parameters: every NCCL_* and OXCCL_* setting oxccl reads, by key ("NCCL_DEBUG" or "DEBUG"). */
OXCCL_NCCL_API(ncclResult_t, ncclParamBind, (ncclParamHandle_t * out, const char* key));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t* out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char** out));
OXCCL_NCCL_API(ncclResult_t, ncclParamGet, (ncclParamHandle_t h, void* out, int maxLen, int* len));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetParameter, (const char* key, const char** value, int* valueLen));
OXCCL_NCCL_API(ncclResult_t, ncclParamGetAllParameterKeys, (const char*** table, int* tableLen));
OXCCL_NCCL_API(void, ncclParamDumpAll, (void));
/* Kept for NCCL's deprecated call: oxccl reads the logging settings at each init. */
OXCCL_NCCL_API(void, ncclResetDebugInit, (void));

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
