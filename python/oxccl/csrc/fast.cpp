// The torch backend's compiled fast path: a c10d Backend that forwards every call to its Python
// subclass's method of the same name (as torch's trampoline for Python backends does), but
// answers the common calls in C++ (contiguous CPU tensors of a type oxccl has: allreduce,
// broadcast and reduce of one tensor, all_gather_single, reduce_scatter_single,
// all_to_all_single, barrier): straight into the extension's C entry point, with no Python on
// the way and the GIL untouched. Every other call, and one the entry point hands back (an
// argument it would reject, PREMUL_SUM, ...), goes to the Python method of the same name, as
// for any Python backend, so that errors and rare forms have one implementation.
//
// Rules: the communicator handle (a reference of its own, see python/src/fast.rs) is released
// with the backend; a failure raises the oxccl exception class the library names, with its
// message; nothing here allocates per call beyond the Work and its future. `OxCall` is laid
// out as python/src/fast.rs's `FastCall`, field for field.

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/py/PyProcessGroup.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// One call (python/src/fast.rs: FastCall and its KIND_* numbers).
struct OxCall {
  int32_t kind;
  int32_t dtype;
  int32_t op;
  int64_t root;
  const void* send;
  size_t send_bytes;
  void* recv;
  size_t recv_bytes;
  const int64_t* send_counts;
  const int64_t* recv_counts;
};
enum : int32_t {
  kAllReduce = 0,
  kBroadcast = 1,
  kReduce = 2,
  kAllGather = 3,
  kReduceScatter = 4,
  kAllToAll = 5,
  kAllToAllV = 6,
  kBarrier = 7,
};

// (handle, call, error text, its size, error kind, [rank, peer]) → 0 done, 1 failed, 2 not taken
using CallFn = int (*)(const void*, const OxCall*, char*, size_t, int*, int64_t*);
using ReleaseFn = void (*)(void*);

// A call complete when it returns: its future already holds the outputs.
class DoneWork : public c10d::Work {
 public:
  DoneWork(std::vector<at::Tensor> out, c10d::OpType type) : c10d::Work(-1, type), out_(std::move(out)) {}
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return out_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto f = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    f->markCompleted(c10::IValue(out_));
    return f;
  }

 private:
  std::vector<at::Tensor> out_;
};

// NCCL's type numbers (oxccl's), 100 for bool (python/src/fast.rs: DTYPE_BOOL, reduced
// logically), or -1.
int type_of(at::ScalarType t) {
  switch (t) {
    case at::kChar: return 0;
    case at::kByte: return 1;
    case at::kBool: return 100;
    case at::kInt: return 2;
    case at::kUInt32: return 3;
    case at::kLong: return 4;
    case at::kUInt64: return 5;
    case at::kHalf: return 6;
    case at::kFloat: return 7;
    case at::kDouble: return 8;
    case at::kBFloat16: return 9;
    case at::kFloat8_e4m3fn: return 10;
    case at::kFloat8_e5m2: return 11;
    default: return -1;
  }
}

// A tensor the entry point can take as it is: contiguous CPU memory of a type oxccl has.
bool plain(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_conj() && !t.is_neg() &&
         type_of(t.scalar_type()) >= 0;
}

// NCCL's operator numbers (oxccl's), or -1 (PREMUL_SUM and the rest take the Python path).
int op_of(const c10d::ReduceOp& o) {
  switch (o.op_) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MAX: return 2;
    case c10d::ReduceOp::MIN: return 3;
    case c10d::ReduceOp::AVG: return 4;
    case c10d::ReduceOp::BAND: return 0x40;
    case c10d::ReduceOp::BOR: return 0x41;
    case c10d::ReduceOp::BXOR: return 0x42;
    default: return -1;
  }
}


// torch's option structs reach the Python methods as namespaces with the fields they read
// (rootRank, reduceOp): the structs' own Python types are not visible to an extension.
py::object op_obj(const c10d::ReduceOp& o) {
  py::object dist = py::module_::import("torch.distributed");
  if (o.op_ == c10d::ReduceOp::PREMUL_SUM) {
    auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(o.supplement_.get());
    py::object f = sup == nullptr ? py::object(py::float_(1.0))
                   : sup->tensor_factor.defined() ? py::cast(sup->tensor_factor)
                                                  : py::object(py::float_(sup->double_factor));
    return dist.attr("_make_nccl_premul_sum")(f);
  }
  const char* name = "SUM";
  switch (o.op_) {
    case c10d::ReduceOp::AVG: name = "AVG"; break;
    case c10d::ReduceOp::PRODUCT: name = "PRODUCT"; break;
    case c10d::ReduceOp::MIN: name = "MIN"; break;
    case c10d::ReduceOp::MAX: name = "MAX"; break;
    case c10d::ReduceOp::BAND: name = "BAND"; break;
    case c10d::ReduceOp::BOR: name = "BOR"; break;
    case c10d::ReduceOp::BXOR: name = "BXOR"; break;
    default: break;
  }
  return dist.attr("ReduceOp").attr(name);
}

py::object ns() { return py::module_::import("types").attr("SimpleNamespace")(); }
py::object P(const c10d::BroadcastOptions& o) { auto n = ns(); n.attr("rootRank") = o.rootRank; return n; }
py::object P(const c10d::AllreduceOptions& o) { auto n = ns(); n.attr("reduceOp") = op_obj(o.reduceOp); return n; }
py::object P(const c10d::AllreduceCoalescedOptions& o) { auto n = ns(); n.attr("reduceOp") = op_obj(o.reduceOp); return n; }
py::object P(const c10d::ReduceOptions& o) {
  auto n = ns(); n.attr("reduceOp") = op_obj(o.reduceOp); n.attr("rootRank") = o.rootRank; return n;
}
py::object P(const c10d::ReduceScatterOptions& o) { auto n = ns(); n.attr("reduceOp") = op_obj(o.reduceOp); return n; }
py::object P(const c10d::GatherOptions& o) { auto n = ns(); n.attr("rootRank") = o.rootRank; return n; }
py::object P(const c10d::ScatterOptions& o) { auto n = ns(); n.attr("rootRank") = o.rootRank; return n; }
py::object P(const c10d::AllgatherOptions&) { return ns(); }
py::object P(const c10d::AllToAllOptions&) { return ns(); }
py::object P(const c10d::BarrierOptions&) { return ns(); }

// A Python Work (a send or receive still running) kept alive with its Python object, as torch's
// PyWorkHolder keeps one, but also answering isCompleted from the object's is_completed() and
// sourceRank from its _source_rank(): torch's holder forwards only wait and getFuture, so a
// caller would see False forever, and no sender for a receive from any rank.
class OxWorkHolder : public c10d::Work {
 public:
  explicit OxWorkHolder(py::object w)
      : work_(w.cast<c10::intrusive_ptr<c10d::Work>>()), py_(std::move(w)) {}
  ~OxWorkHolder() override {
    py::gil_scoped_acquire gil;
    py_ = py::object();
  }
  bool wait(std::chrono::milliseconds timeout) override { return work_->wait(timeout); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return work_->getFuture(); }
  bool isCompleted() override {
    py::gil_scoped_acquire gil;
    return py_.attr("is_completed")().cast<bool>();
  }
  // The sender of a receive from any rank (torch's recv without src reads it here).
  int sourceRank() const override {
    py::gil_scoped_acquire gil;
    return py_.attr("_source_rank")().cast<int>();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  py::object py_;
};

// Calls the Python method `pyname` of this object's Python class, if it defines one, with the
// GIL held, and returns its Work: torch's own Work as it is (so is_completed and result answer),
// a Python Work kept alive with its Python object (OxWorkHolder); else the base's.
#define OX_WORK(pyname, base_call, ...)                                                       \
  do {                                                                                        \
    py::gil_scoped_acquire gil;                                                               \
    py::function ox_fn_ = py::get_override(static_cast<const FastBackend*>(this), pyname);    \
    if (ox_fn_) {                                                                             \
      py::object ox_r_ = ox_fn_(__VA_ARGS__);                                                 \
      if (ox_r_.is_none()) return c10::intrusive_ptr<c10d::Work>();                           \
      if (!py::hasattr(ox_r_, "_oxccl_python_work"))                                          \
        return ox_r_.cast<c10::intrusive_ptr<c10d::Work>>();                                  \
      return c10::make_intrusive<OxWorkHolder>(std::move(ox_r_));                             \
    }                                                                                         \
    return base_call;                                                                         \
  } while (false)

#define OX_VOID(pyname)                                                                       \
  do {                                                                                        \
    py::gil_scoped_acquire gil;                                                               \
    py::function ox_fn_ = py::get_override(static_cast<const FastBackend*>(this), pyname);    \
    if (ox_fn_) ox_fn_();                                                                     \
  } while (false)

// A c10d Backend whose Python subclass (oxccl.torch.OxcclBackend) answers every call but the
// common allreduce: torch's own trampoline for Python backends looks a Python method up by
// the Backend type alone, which a class of ours deriving from it is not, so this one looks it
// up by its own type.
class FastBackend : public c10d::Backend {
 public:
  FastBackend(int rank, int size) : c10d::Backend(rank, size) {}

  ~FastBackend() override {
    if (release_ != nullptr && handle_ != nullptr) release_(handle_);
  }

  void set_fast(uintptr_t handle, uintptr_t call, uintptr_t release, double timeout_s) {
    if (release_ != nullptr && handle_ != nullptr) release_(handle_);
    handle_ = reinterpret_cast<void*>(handle);
    call_ = reinterpret_cast<CallFn>(call);
    release_ = reinterpret_cast<ReleaseFn>(release);
    options_ = c10::make_intrusive<c10d::Backend::Options>(
        "oxccl", std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  }

  const std::string getBackendName() const override { return "oxccl"; }
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return options_ ? options_ : c10::make_intrusive<c10d::Backend::Options>("oxccl");
  }
  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return true; }
  bool supportsTimeEstimation() const override { return false; }
  bool supportsShrinking() const override { return false; }
  bool supportsReconfigure() const override { return false; }
  bool supportsWindow() const override { return false; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& t, const c10d::AllreduceOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    if (t.size() == 1 && plain(t[0]) && run(one(kAllReduce, t[0], op_of(o.reduceOp), 0), c10d::OpType::ALLREDUCE, t, w))
      return w;
    OX_WORK("allreduce", c10d::Backend::allreduce(t, o), t, P(o));
  }
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    if (t.size() == 1 && o.rootTensor == 0 && plain(t[0]) &&
        run(one(kBroadcast, t[0], 0, o.rootRank), c10d::OpType::BROADCAST, t, w))
      return w;
    OX_WORK("broadcast", c10d::Backend::broadcast(t, o), t, P(o));
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& t,
                                                     const c10d::AllreduceCoalescedOptions& o) override {
    ++seq_;
    OX_WORK("allreduce_coalesced", c10d::Backend::allreduce_coalesced(t, o), t, P(o));
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    if (t.size() == 1 && o.rootTensor == 0 && plain(t[0]) &&
        run(one(kReduce, t[0], op_of(o.reduceOp), o.rootRank), c10d::OpType::REDUCE, t, w))
      return w;
    OX_WORK("reduce", c10d::Backend::reduce(t, o), t, P(o));
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& o) override {
    ++seq_;
    OX_WORK("allgather", c10d::Backend::allgather(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& out, at::Tensor& in,
                                                   const c10d::AllgatherOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    if (two(out, in) && out.numel() == in.numel() * getSize() &&
        run(pair(kAllGather, out, in, 0), c10d::OpType::_ALLGATHER_BASE, {out}, w))
      return w;
    OX_WORK("all_gather_single", c10d::Backend::all_gather_single(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                     std::vector<at::Tensor>& in,
                                                     const c10d::AllgatherOptions& o) override {
    ++seq_;
    OX_WORK("allgather_coalesced", c10d::Backend::allgather_coalesced(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(std::vector<at::Tensor>& out,
                                                             std::vector<at::Tensor>& in,
                                                             const c10d::AllgatherOptions& o) override {
    ++seq_;
    OX_WORK("all_gather_single_coalesced", c10d::Backend::all_gather_single_coalesced(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& o) override {
    ++seq_;
    OX_WORK("gather", c10d::Backend::gather(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& o) override {
    ++seq_;
    OX_WORK("scatter", c10d::Backend::scatter(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out,
                                                std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& o) override {
    ++seq_;
    OX_WORK("reduce_scatter", c10d::Backend::reduce_scatter(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& out, at::Tensor& in,
                                                       const c10d::ReduceScatterOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    if (two(out, in) && in.numel() == out.numel() * getSize() &&
        run(pair(kReduceScatter, out, in, op_of(o.reduceOp)), c10d::OpType::_REDUCE_SCATTER_BASE, {out}, w))
      return w;
    OX_WORK("reduce_scatter_single", c10d::Backend::reduce_scatter_single(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(std::vector<at::Tensor>& out,
                                                                 std::vector<at::Tensor>& in,
                                                                 const c10d::ReduceScatterOptions& o) override {
    ++seq_;
    OX_WORK("reduce_scatter_single_coalesced", c10d::Backend::reduce_scatter_single_coalesced(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outs,
                                                   std::vector<int64_t>& ins, const c10d::AllToAllOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    if (two(out, in)) {
      OxCall c = pair(kAllToAll, out, in, 0);
      std::vector<int64_t> sc, rc;
      if (!outs.empty() || !ins.empty()) {
        c.kind = kAllToAllV;
        if (counts(in, ins, sc) && counts(out, outs, rc)) {
          c.send_counts = sc.data();
          c.recv_counts = rc.data();
        } else {
          c.kind = -1;  // the Python path names what is wrong
        }
      }
      if (run(c, c10d::OpType::ALLTOALL_BASE, {out}, w)) return w;
    }
    OX_WORK("all_to_all_single", c10d::Backend::all_to_all_single(out, in, outs, ins, o), out, in, outs, ins, P(o));
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& o) override {
    ++seq_;
    OX_WORK("alltoall", c10d::Backend::alltoall(out, in, o), out, in, P(o));
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    OX_WORK("send", c10d::Backend::send(t, dst, tag), t, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    OX_WORK("recv", c10d::Backend::recv(t, src, tag), t, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override {
    OX_WORK("recv_anysource", c10d::Backend::recvAnysource(t, tag), t, tag);
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& o) override {
    ++seq_;
    c10::intrusive_ptr<c10d::Work> w;
    OxCall c{};
    c.kind = kBarrier;
    if (run(c, c10d::OpType::BARRIER, {}, w)) return w;
    OX_WORK("barrier", c10d::Backend::barrier(o), P(o));
  }
  void startCoalescing() override { OX_VOID("start_coalescing"); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    OX_WORK("end_coalescing", c10d::Backend::endCoalescing());
  }
  void shutdown() override { OX_VOID("shutdown"); }

  // The collectives this rank has issued on the group (every entry point above counts one, as
  // Gloo's count): the same on every rank whose calls agree.
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void setSequenceNumberForGroup() override {}

  // Gloo's monitored barrier, answered by the Python method (over the group's store: a rank
  // that never comes leaves no call pending on the communicator).
  void monitoredBarrier(const c10d::BarrierOptions& o, bool waitAllRanks) override {
    py::gil_scoped_acquire gil;
    py::function fn = py::get_override(static_cast<const FastBackend*>(this), "monitored_barrier");
    if (!fn) return c10d::Backend::monitoredBarrier(o, waitAllRanks);
    fn(static_cast<double>(o.timeout.count()) / 1000.0, waitAllRanks);
  }
  void abort() override { OX_VOID("abort"); }

 private:
  // A call on one tensor, in place.
  static OxCall one(int32_t kind, at::Tensor& t, int op, int64_t root) {
    OxCall c{};
    c.kind = op < 0 ? -1 : kind;
    c.dtype = type_of(t.scalar_type());
    c.op = op;
    c.root = root;
    c.recv = t.data_ptr();
    c.recv_bytes = t.nbytes();
    return c;
  }

  // A call from `in` into `out`.
  static OxCall pair(int32_t kind, at::Tensor& out, at::Tensor& in, int op) {
    OxCall c = one(kind, out, op, 0);
    c.send = in.data_ptr();
    c.send_bytes = in.nbytes();
    return c;
  }

  static bool two(const at::Tensor& out, const at::Tensor& in) {
    return plain(out) && plain(in) && out.scalar_type() == in.scalar_type();
  }

  // all_to_all_single's split sizes (rows per rank; none: even) → elements per rank, as the
  // Python path computes them; false where they do not fit the tensor.
  bool counts(const at::Tensor& t, const std::vector<int64_t>& splits, std::vector<int64_t>& out) const {
    int64_t p = getSize();
    int64_t rows = t.dim() > 0 ? t.size(0) : 0;
    int64_t row = rows > 0 ? t.numel() / rows : 0;
    if (splits.empty()) {
      if (p <= 0 || rows % p != 0) return false;
      out.assign(p, rows / p * row);
      return true;
    }
    if (static_cast<int64_t>(splits.size()) != p) return false;
    int64_t sum = 0;
    out.clear();
    for (int64_t s : splits) {
      if (s < 0) return false;
      sum += s;
      out.push_back(s * row);
    }
    return sum == rows;
  }

  // Runs `c` through the extension's entry point: true, with `w` its Work, when it ran; false
  // when the Python path must take the call; raises the call's error.
  bool run(const OxCall& c, c10d::OpType type, std::vector<at::Tensor> outs, c10::intrusive_ptr<c10d::Work>& w) {
    if (call_ == nullptr || c.kind < 0 || c.dtype < 0) return false;
    char err[4096];
    int kind = 0;
    int64_t ranks[2] = {-1, -1};
    int rc = call_(handle_, &c, err, sizeof err, &kind, ranks);
    if (rc == 1) raise(kind, err, ranks[0], ranks[1]);
    if (rc != 0) return false;
    w = c10::make_intrusive<DoneWork>(std::move(outs), type);
    return true;
  }

  [[noreturn]] static void raise(int kind, const char* msg, int64_t rank, int64_t peer) {
    py::gil_scoped_acquire gil;
    // The class names by number come from the extension (errors::KINDS), the one list.
    py::list kinds = py::module_::import("oxccl._oxccl").attr("_fast_api")()[py::int_(1)];
    py::object name = kind >= 0 && kind < static_cast<int>(kinds.size()) ? kinds[kind] : py::str("Error");
    py::object cls = py::module_::import("oxccl.errors").attr(name);
    auto opt = [](int64_t r) { return r >= 0 ? py::object(py::int_(r)) : py::object(py::none()); };
    py::object e = cls(std::string(msg), opt(rank), opt(peer));
    PyErr_SetObject(cls.ptr(), e.ptr());
    throw py::error_already_set();
  }

  uint64_t seq_ = 0;
  void* handle_ = nullptr;
  CallFn call_ = nullptr;
  ReleaseFn release_ = nullptr;
  c10::intrusive_ptr<c10d::Backend::Options> options_;
};

}  // namespace

// torch's ProcessGroup under the name "oxccl": torch asks a group, not its backend, for the name
// it reports (DDP's logging data, ProcessGroup::getBackendName), and a plugin's group otherwise
// says "custom". oxccl.torch hands torch one when every device of the group is oxccl's.
class OxProcessGroup : public c10d::ProcessGroup {
 public:
  OxProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size)
      : c10d::ProcessGroup(store, rank, size) {}
  const std::string getBackendName() const override { return "oxccl"; }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Registered so that handing a DoneWork to Python finds its type at once (an unregistered
  // derived type costs pybind a failed lookup per call: about 0.7 µs of an 8-byte call).
  py::class_<DoneWork, c10d::Work, c10::intrusive_ptr<DoneWork>>(m, "DoneWork");
  py::class_<FastBackend, c10d::Backend, c10::intrusive_ptr<FastBackend>>(m, "FastBackend")
      .def(py::init<int, int>())
      .def("_set_fast", &FastBackend::set_fast);
  py::class_<OxProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<OxProcessGroup>>(m, "ProcessGroup")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int>());
}
