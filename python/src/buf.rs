//! Buffers from Python objects: torch tensors (CPU or CUDA), and anything with the buffer
//! protocol (numpy arrays, bytearray, array.array, memoryview), and what their elements are.
//!
//! Rules: a buffer must be C-contiguous and, where a call writes it, writable; its element
//! type comes from the object (numpy's buffer format, torch's dtype) unless the caller names
//! one (`dtype=`), which reinterprets the bytes (numpy has no bfloat16 or fp8: pass
//! `dtype="bfloat16"` over a uint16 array). Every element type is either carried exactly or
//! refused by name, never guessed ([`Elem`]): the types of [`DataType`] reduce as themselves;
//! bool travels as uint8 and reduces logically; complex numbers travel as pairs of their
//! component type and reduce by sum and avg only; types oxccl has no arithmetic for (int16,
//! uint16, fp8 variants other than e4m3fn/e5m2, structured and string arrays, non-native
//! byte order) are moved as bytes by the calls that only move data and refused by
//! reductions; objects (Python pointers), quantized tensors and lazily conjugated or negated
//! tensors are refused. The address is read with the GIL held; the caller keeps the object
//! referenced while a call may touch the memory.

use crate::errors::invalid;
use oxccl::{DataType, ReduceOp};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};

/// Where a buffer's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Host,
    /// A CUDA device (ordinal).
    Cuda(i32),
}

/// A type's name, held inline so that [`Buf`] stays `Copy` (names longer than its room are
/// cut, ending in "…").
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Name {
    len: u8,
    b: [u8; 47],
}

impl Name {
    pub fn new(s: &str) -> Name {
        let mut n = Name { len: 0, b: [0; 47] };
        let room = n.b.len();
        let s = if s.len() <= room {
            s
        } else {
            // Cut at a character boundary, leaving room for the ellipsis (3 bytes).
            let mut end = room - 3;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            n.b[end..end + 3].copy_from_slice("…".as_bytes());
            n.len = (end + 3) as u8;
            n.b[..end].copy_from_slice(&s.as_bytes()[..end]);
            return n;
        };
        n.b[..s.len()].copy_from_slice(s.as_bytes());
        n.len = s.len() as u8;
        n
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.b[..self.len as usize]).unwrap_or("?")
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

/// What a buffer's elements are, beyond the [`DataType`] they travel as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// The data type itself.
    Plain,
    /// bool (numpy's and torch's: one byte, 0 or 1), carried as uint8. Reductions are logical,
    /// as torch's NCCL and Gloo backends define them: sum and max are or, prod and min are
    /// and, band/bor/bxor are and/or/xor; avg has no meaning and is refused.
    Bool,
    /// Complex numbers: (real, imaginary) pairs of the data type. Sum and avg reduce each part
    /// on its own (exact definitions); prod, max, min and the bitwise operators are refused.
    Complex,
    /// A type oxccl has no arithmetic for (its name): moved as bytes (uint8) by the calls that
    /// only move data, refused by reductions.
    Bytes(Name),
}

/// An element type: the data type it travels as, and what its elements are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ty {
    pub dtype: DataType,
    pub elem: Elem,
}

impl Ty {
    pub const fn plain(dtype: DataType) -> Ty {
        Ty { dtype, elem: Elem::Plain }
    }

    fn bool() -> Ty {
        Ty { dtype: DataType::U8, elem: Elem::Bool }
    }

    fn complex(part: DataType) -> Ty {
        Ty { dtype: part, elem: Elem::Complex }
    }

    fn bytes(name: &str) -> Ty {
        Ty { dtype: DataType::U8, elem: Elem::Bytes(Name::new(name)) }
    }

    /// The name users know it by (numpy's and torch's).
    pub fn name(&self) -> String {
        match self.elem {
            Elem::Plain => py_name(self.dtype).to_string(),
            Elem::Bool => "bool".into(),
            Elem::Complex => format!("complex{}", self.dtype.size_bytes() * 16),
            Elem::Bytes(n) => n.as_str().to_string(),
        }
    }

    /// The operator a reduction of this type runs as `op`, or why it cannot be reduced.
    pub fn reduction(&self, op: ReduceOp) -> Result<ReduceOp, String> {
        match self.elem {
            Elem::Plain => Ok(op),
            Elem::Bool => match op {
                ReduceOp::Sum | ReduceOp::Max => Ok(ReduceOp::Max),
                ReduceOp::Prod | ReduceOp::Min => Ok(ReduceOp::Min),
                ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => Ok(op),
                ReduceOp::Avg => Err("avg has no meaning for bool (sum and max reduce bool as logical or, prod and min as and)".into()),
            },
            Elem::Complex => match op {
                ReduceOp::Sum | ReduceOp::Avg => Ok(op),
                _ => Err(format!(
                    "{} is not defined on {} (oxccl reduces complex numbers with sum and avg only)",
                    op.name(),
                    self.name()
                )),
            },
            Elem::Bytes(n) => Err(format!(
                "{} cannot be reduced: oxccl has no arithmetic for it (it moves {} in broadcast, gathers, scatters, all-to-all and send/recv); reductions take {}",
                n.as_str(),
                n.as_str(),
                reducible()
            )),
        }
    }
}

/// A data type's name as numpy and torch spell it.
pub fn py_name(d: DataType) -> &'static str {
    match d {
        DataType::F16 => "float16",
        DataType::F32 => "float32",
        DataType::F64 => "float64",
        DataType::F8E4M3 => "float8_e4m3fn",
        DataType::F8E5M2 => "float8_e5m2",
        d => d.name(),
    }
}

/// The element types reductions take, by the names users know (`oxccl.data_types()`).
pub fn reducible_names() -> Vec<&'static str> {
    let mut v: Vec<&str> = DataType::ALL.iter().map(|d| py_name(*d)).collect();
    v.extend(["bool", "complex32", "complex64", "complex128"]);
    v
}

/// The element types reductions take, for messages (the one list: [`reducible_names`], whose
/// rules are [`Ty::reduction`]'s).
pub fn reducible() -> String {
    format!(
        "{} (bool logical: sum/max are or, prod/min are and; complex with sum and avg only)",
        reducible_names().join(", ")
    )
}

/// Every element type oxccl takes, for messages.
pub fn accepted() -> String {
    format!(
        "reductions take {}; the calls that only move data also take any other fixed-size type (int16, uint16, other fp8 kinds, structured and string arrays: moved as bytes)",
        reducible()
    )
}

/// One buffer of a call: address, bytes, type, place.
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    pub ptr: usize,
    pub len: usize,
    pub dtype: DataType,
    pub elem: Elem,
    pub place: Place,
}

impl Buf {
    pub fn count(&self) -> usize {
        self.len / self.dtype.size_bytes()
    }

    pub fn ty(&self) -> Ty {
        Ty { dtype: self.dtype, elem: self.elem }
    }

    /// Whether the two byte ranges share any byte.
    pub fn overlaps(&self, o: &Buf) -> bool {
        self.len > 0 && o.len > 0 && self.ptr < o.ptr + o.len && o.ptr < self.ptr + self.len
    }
}

/// How torch's dtypes (by attribute name) travel: the types oxccl has, bool, complex, types
/// moved as bytes; a name absent here is refused.
fn torch_ty(name: &str) -> Option<Result<Ty, String>> {
    let t = match name {
        "bool" => Ty::bool(),
        "complex32" => Ty::complex(DataType::F16),
        "complex64" => Ty::complex(DataType::F32),
        "complex128" => Ty::complex(DataType::F64),
        "float8_e4m3fn" => Ty::plain(DataType::F8E4M3),
        "float8_e5m2" => Ty::plain(DataType::F8E5M2),
        "int16" | "uint16" | "float8_e4m3fnuz" | "float8_e5m2fnuz" | "float8_e8m0fnu" | "float4_e2m1fn_x2"
        | "bits8" | "bits16" | "bits1x8" | "bits2x4" | "bits4x2" => Ty::bytes(name),
        "qint8" | "quint8" | "qint32" | "quint4x2" | "quint2x4" => {
            return Some(Err(format!(
                "{name} is a quantized type, whose scale and zero point a collective would not carry (pass tensor.dequantize(), or tensor.int_repr() for the raw integers)"
            )))
        }
        n if n.starts_with("uint") || n.starts_with("int") => {
            // torch's sub-byte placeholders (uint1..uint7, int1..int7) and any wider integer
            // oxccl has.
            match DataType::parse(n) {
                Some(d) => Ty::plain(d),
                None => {
                    return Some(Err(format!(
                        "{n} packs elements into bits of a byte, which oxccl cannot address"
                    )))
                }
            }
        }
        n => Ty::plain(DataType::parse(n)?),
    };
    Some(Ok(t))
}

/// The names the torch table knows (each torch dtype attribute looked up once).
const TORCH_NAMES: &[&str] = &[
    "bool",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "bfloat16",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "bits8",
    "bits16",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "qint8",
    "quint8",
    "qint32",
    "quint4x2",
    "quint2x4",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
];

struct Torch {
    tensor: Py<PyType>,
    /// torch dtype → index into `tys`.
    dtypes: Py<PyDict>,
    tys: Vec<Result<Ty, String>>,
    strided: Py<PyAny>,
}

static TORCH: PyOnceLock<Option<Torch>> = PyOnceLock::new();

/// torch's Tensor type and dtype table, once torch has been imported by the program (we never
/// import it ourselves: numpy users need not have it).
fn torch(py: Python<'_>) -> Option<&Torch> {
    if let Some(t) = TORCH.get(py) {
        return t.as_ref();
    }
    let loaded = py.import("sys").ok()?.getattr("modules").ok()?.get_item("torch").ok()?;
    let t = (|| -> PyResult<Torch> {
        let tensor = loaded.getattr("Tensor")?.cast_into::<PyType>()?.unbind();
        let dtypes = PyDict::new(py);
        let mut tys = Vec::new();
        for name in TORCH_NAMES {
            if let (Ok(d), Some(ty)) = (loaded.getattr(*name), torch_ty(name)) {
                dtypes.set_item(d, tys.len())?;
                tys.push(ty);
            }
        }
        let strided = loaded.getattr("strided")?.unbind();
        Ok(Torch { tensor, dtypes: dtypes.unbind(), tys, strided })
    })()
    .ok()?;
    let _ = TORCH.set(py, Some(t));
    TORCH.get(py).and_then(|t| t.as_ref())
}

/// A buffer-protocol format (numpy's, struct's) and item size → its element type; `Err` for
/// one no process but this can use (Python objects).
fn from_format(fmt: &str, item: usize) -> Result<Ty, String> {
    let native = cfg!(target_endian = "little");
    let (order, c) = match fmt.chars().next() {
        Some(o @ ('@' | '=' | '<' | '>' | '!')) => (o, &fmt[1..]),
        _ => ('@', fmt),
    };
    let foreign = match order {
        '<' => !native,
        '>' | '!' => native,
        _ => false,
    };
    if c == "O" {
        return Err("an array of Python objects holds pointers, which mean nothing in another process (convert it to a numeric dtype)".into());
    }
    if foreign && item > 1 {
        return Ok(Ty::bytes(&format!("non-native byte order (format {fmt:?})")));
    }
    let signed = matches!(c, "b" | "h" | "i" | "l" | "q" | "n");
    let unsigned = matches!(c, "B" | "H" | "I" | "L" | "Q" | "N");
    let t = match (c, item) {
        ("?", 1) => Ty::bool(),
        ("e", 2) => Ty::plain(DataType::F16),
        ("f", 4) => Ty::plain(DataType::F32),
        ("d", 8) => Ty::plain(DataType::F64),
        ("Zf", 8) => Ty::complex(DataType::F32),
        ("Zd", 16) => Ty::complex(DataType::F64),
        ("g", _) => Ty::bytes("longdouble"),
        ("Zg", _) => Ty::bytes("clongdouble"),
        (_, 1) if signed => Ty::plain(DataType::I8),
        (_, 1) if unsigned => Ty::plain(DataType::U8),
        (_, 2) if signed => Ty::bytes("int16"),
        (_, 2) if unsigned => Ty::bytes("uint16"),
        (_, 4) if signed => Ty::plain(DataType::I32),
        (_, 4) if unsigned => Ty::plain(DataType::U32),
        (_, 8) if signed => Ty::plain(DataType::I64),
        (_, 8) if unsigned => Ty::plain(DataType::U64),
        ("c", 1) => Ty::bytes("char"),
        _ if c.starts_with("T{") => Ty::bytes(&format!("a structured dtype (format {fmt:?})")),
        _ if c.ends_with('w') => Ty::bytes(&format!("a unicode string dtype (format {fmt:?})")),
        _ if c.ends_with('s') => Ty::bytes(&format!("a bytes string dtype (format {fmt:?})")),
        _ => Ty::bytes(&format!("format {fmt:?} ({item} bytes)")),
    };
    Ok(t)
}

/// Parses a `dtype=` argument: a name (`"float32"`, `"bfloat16"`, `"f8e4m3"`, `"bool"`,
/// `"complex64"`, …), a numpy dtype or a torch dtype (anything whose `str()` ends in such a
/// name).
pub fn parse_dtype(o: &Bound<'_, PyAny>) -> PyResult<Ty> {
    // A type object (numpy's scalar types: np.float32) by its name; anything else by str().
    let s = match o.cast::<PyType>() {
        Ok(t) => t.name()?.to_string(),
        Err(_) => o.str()?.to_string(),
    };
    let name = s.rsplit('.').next().unwrap_or(&s);
    let name = match name {
        "bool_" => "bool",
        "f8e4m3" | "fp8_e4m3" | "e4m3" => "float8_e4m3fn",
        "f8e5m2" | "fp8_e5m2" | "e5m2" => "float8_e5m2",
        n => n,
    };
    match torch_ty(name) {
        Some(Ok(t)) => Ok(t),
        Some(Err(why)) => Err(invalid("dtype", why)),
        None => Err(invalid("dtype", format!("{s} is not a data type oxccl takes ({})", accepted()))),
    }
}

/// The bytes of one element of `t`.
fn unit(t: Ty) -> usize {
    t.dtype.size_bytes() * if t.elem == Elem::Complex { 2 } else { 1 }
}

fn whole(arg: &str, len: usize, t: Ty) -> PyResult<()> {
    if len % unit(t) != 0 {
        return Err(invalid(arg, format!("{len} bytes is not a whole number of {} elements", t.name())));
    }
    Ok(())
}

/// The buffer `arg` names, for a call that writes it when `write`.
pub fn get(arg: &str, o: &Bound<'_, PyAny>, write: bool, dtype: Option<Ty>) -> PyResult<Buf> {
    let py = o.py();
    if let Some(t) = torch(py) {
        if o.is_instance(t.tensor.bind(py))? {
            return tensor(arg, o, t, dtype);
        }
    }
    let b = PyUntypedBuffer::get(o).map_err(|e| {
        let what = o.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
        match o.getattr(pyo3::intern!(py, "dtype")) {
            // numpy has the object but cannot export it (datetime64 and timedelta64, say).
            Ok(dt) => invalid(
                arg,
                format!(
                    "a {what} of dtype {} cannot be exported as a buffer ({e}); view it as a type oxccl takes (a.view('int64') for datetime64 and timedelta64)",
                    dt.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into())
                ),
            ),
            Err(_) => invalid(
                arg,
                format!("a {what} is neither a torch tensor nor an object with the buffer protocol (a numpy array, say)"),
            ),
        }
    })?;
    if !b.is_c_contiguous() {
        return Err(invalid(
            arg,
            "the array is not C-contiguous (Fortran order, or a strided view): pass numpy.ascontiguousarray(a)",
        ));
    }
    if write && b.readonly() {
        return Err(invalid(arg, "the array is read-only, and this call writes it"));
    }
    let t = match dtype {
        Some(d) => d,
        None => {
            let fmt = b.format().to_string_lossy();
            from_format(&fmt, b.item_size()).map_err(|why| invalid(arg, why))?
        }
    };
    let len = b.len_bytes();
    whole(arg, len, t)?;
    Ok(Buf { ptr: b.buf_ptr() as usize, len, dtype: t.dtype, elem: t.elem, place: Place::Host })
}

fn tensor(arg: &str, o: &Bound<'_, PyAny>, t: &Torch, dtype: Option<Ty>) -> PyResult<Buf> {
    let py = o.py();
    let ty = match dtype {
        Some(d) => d,
        None => {
            let tdt = o.getattr(pyo3::intern!(py, "dtype"))?;
            let found = t.dtypes.bind(py).get_item(&tdt)?.map(|i| i.extract::<usize>()).transpose()?;
            match found.and_then(|i| t.tys.get(i)) {
                Some(Ok(ty)) => *ty,
                Some(Err(why)) => {
                    return Err(invalid(arg, format!("the tensor's dtype {}: {why}", tdt.str()?)))
                }
                None => {
                    return Err(invalid(
                        arg,
                        format!("the tensor's dtype {} is not one oxccl takes ({})", tdt.str()?, accepted()),
                    ))
                }
            }
        }
    };
    // Dense (strided) memory only. A tensor of exactly torch.Tensor's type can only be of
    // another layout if is_contiguous() or data_ptr() says so (sparse, mkldnn): its layout is
    // read on those paths alone, which keeps the common call at the attributes it needs;
    // subclasses (nested tensors among them) are read at once.
    let sparse = |o: &Bound<'_, PyAny>| -> PyResult<Option<PyErr>> {
        let layout = o.getattr(pyo3::intern!(py, "layout"))?;
        Ok((!layout.is(t.strided.bind(py))).then(|| {
            invalid(
                arg,
                format!(
                    "the tensor's layout is {}; oxccl takes dense (strided) tensors (pass tensor.to_dense())",
                    layout.str().map(|s| s.to_string()).unwrap_or_else(|_| "?".into())
                ),
            )
        }))
    };
    if !o.get_type().is(t.tensor.bind(py)) {
        if let Some(e) = sparse(o)? {
            return Err(e);
        }
    }
    match o.call_method0(pyo3::intern!(py, "is_contiguous")) {
        Ok(c) if c.is_truthy()? => {}
        other => {
            if let Some(e) = sparse(o)? {
                return Err(e);
            }
            other?;
            return Err(invalid(arg, "the tensor is not contiguous (pass tensor.contiguous())"));
        }
    }
    // A lazily conjugated or negated view holds other numbers in memory than it shows. Only a
    // view can be one (`_base` set: a conjugate, its imaginary part, a negative view), and
    // only a complex one has a conjugate bit; the methods that tell cost more than reading
    // `_base`, so they are asked of views alone.
    let is_conj = pyo3::intern!(py, "is_conj");
    let is_neg = pyo3::intern!(py, "is_neg");
    let bits = [(is_neg, "is_neg", "resolve_neg"), (is_conj, "is_conj", "resolve_conj")];
    let view = !o.getattr(pyo3::intern!(py, "_base"))?.is_none();
    let n = match (view, ty.elem == Elem::Complex) {
        (false, _) => 0,
        (true, false) => 1,
        (true, true) => 2,
    };
    for (m, bit, fix) in &bits[..n] {
        if o.call_method0(m)?.is_truthy()? {
            return Err(invalid(
                arg,
                format!("the tensor is a lazy view ({bit}() is True): its memory holds other values than it shows (pass tensor.{fix}())"),
            ));
        }
    }
    let len: usize = o.getattr(pyo3::intern!(py, "nbytes"))?.extract()?;
    whole(arg, len, ty)?;
    let ptr: usize = match o.call_method0(pyo3::intern!(py, "data_ptr")) {
        Ok(p) => p.extract()?,
        Err(e) => return Err(sparse(o)?.unwrap_or(e)),
    };
    let place = if o.getattr(pyo3::intern!(py, "is_cpu"))?.extract::<bool>()? {
        Place::Host
    } else if o.getattr(pyo3::intern!(py, "is_cuda"))?.extract::<bool>()? {
        Place::Cuda(o.call_method0(pyo3::intern!(py, "get_device"))?.extract()?)
    } else {
        let dev = o.getattr(pyo3::intern!(py, "device"))?.str()?.to_string();
        return Err(invalid(arg, format!("the tensor is on {dev}; oxccl takes CPU and CUDA tensors")));
    };
    Ok(Buf { ptr, len, dtype: ty.dtype, elem: ty.elem, place })
}
