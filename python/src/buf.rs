//! Buffers from Python objects: torch tensors (CPU or CUDA), and anything with the buffer
//! protocol (numpy arrays, bytearray, array.array, memoryview).
//!
//! Rules: a buffer must be contiguous (C order) and, where a call writes it, writable; its
//! data type comes from the object (numpy's format, torch's dtype) unless the caller names
//! one (`dtype=`), which reinterprets the bytes (numpy has no bfloat16 or fp8: pass
//! `dtype="bfloat16"` over a uint16 array). The address is read with the GIL held; the caller
//! keeps the object referenced while a call may touch the memory.

use crate::errors::invalid;
use oxccl::DataType;
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

/// One buffer of a call: address, bytes, type, place.
#[derive(Clone, Copy, Debug)]
pub struct Buf {
    pub ptr: usize,
    pub len: usize,
    pub dtype: DataType,
    pub place: Place,
}

impl Buf {
    pub fn count(&self) -> usize {
        self.len / self.dtype.size_bytes()
    }

    /// Whether the two byte ranges share any byte.
    pub fn overlaps(&self, o: &Buf) -> bool {
        self.len > 0 && o.len > 0 && self.ptr < o.ptr + o.len && o.ptr < self.ptr + self.len
    }
}

struct Torch {
    tensor: Py<PyType>,
    /// torch dtype → DataType.
    dtypes: Py<PyDict>,
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
        for (name, dt) in [
            ("int8", DataType::I8),
            ("uint8", DataType::U8),
            // Like torch's NCCL backend: bool as uint8 (max/min/sum-as-or hold for 0/1).
            ("bool", DataType::U8),
            ("int32", DataType::I32),
            ("uint32", DataType::U32),
            ("int64", DataType::I64),
            ("uint64", DataType::U64),
            ("float16", DataType::F16),
            ("float32", DataType::F32),
            ("float64", DataType::F64),
            ("bfloat16", DataType::Bf16),
            ("float8_e4m3fn", DataType::F8E4M3),
            ("float8_e5m2", DataType::F8E5M2),
        ] {
            if let Ok(d) = loaded.getattr(name) {
                dtypes.set_item(d, dt as i32)?;
            }
        }
        Ok(Torch { tensor, dtypes: dtypes.unbind() })
    })()
    .ok()?;
    let _ = TORCH.set(py, Some(t));
    TORCH.get(py).and_then(|t| t.as_ref())
}

/// numpy / struct format characters → DataType (standard sizes checked by item size).
fn from_format(fmt: &str, item: usize) -> Option<DataType> {
    let c = fmt.trim_start_matches(['@', '=', '<', '!']);
    let signed = matches!(c, "b" | "h" | "i" | "l" | "q" | "n");
    let unsigned = matches!(c, "B" | "H" | "I" | "L" | "Q" | "N" | "?" | "c");
    let t = match (c, item) {
        ("e", 2) => DataType::F16,
        ("f", 4) => DataType::F32,
        ("d", 8) => DataType::F64,
        (_, 1) if signed => DataType::I8,
        (_, 1) if unsigned => DataType::U8,
        (_, 4) if signed => DataType::I32,
        (_, 4) if unsigned => DataType::U32,
        (_, 8) if signed => DataType::I64,
        (_, 8) if unsigned => DataType::U64,
        _ => return None,
    };
    Some(t)
}

/// Parses a `dtype=` argument: a name (`"float32"`, `"bfloat16"`, `"f8e4m3"`, …), a numpy
/// dtype or a torch dtype (anything whose `str()` ends in such a name).
pub fn parse_dtype(o: &Bound<'_, PyAny>) -> PyResult<DataType> {
    // A type object (numpy's scalar types: np.float32) by its name; anything else by str().
    let s = match o.cast::<PyType>() {
        Ok(t) => t.name()?.to_string(),
        Err(_) => o.str()?.to_string(),
    };
    let name = s.rsplit('.').next().unwrap_or(&s);
    let name = match name {
        "float8_e4m3fn" => "f8e4m3",
        "float8_e5m2" => "f8e5m2",
        n => n,
    };
    DataType::parse(name)
        .ok_or_else(|| invalid("dtype", format!("{s} is not a data type oxccl has (it has {})", names())))
}

fn names() -> String {
    DataType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ")
}

/// The buffer `arg` names, for a call that writes it when `write`.
pub fn get(arg: &str, o: &Bound<'_, PyAny>, write: bool, dtype: Option<DataType>) -> PyResult<Buf> {
    let py = o.py();
    if let Some(t) = torch(py) {
        if o.is_instance(t.tensor.bind(py))? {
            return tensor(arg, o, t, dtype);
        }
    }
    let b = PyUntypedBuffer::get(o).map_err(|_| {
        invalid(
            arg,
            format!(
                "a {} is neither a torch tensor nor an object with the buffer protocol (a numpy array, say)",
                o.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
            ),
        )
    })?;
    if !b.is_c_contiguous() {
        return Err(invalid(
            arg,
            "the array is not contiguous (pass a contiguous copy: numpy.ascontiguousarray)",
        ));
    }
    if write && b.readonly() {
        return Err(invalid(arg, "the array is read-only, and this call writes it"));
    }
    let fmt = b.format().to_string_lossy();
    let dt = match dtype {
        Some(d) => d,
        None => from_format(&fmt, b.item_size()).ok_or_else(|| {
            invalid(
                arg,
                format!(
                    "its element type (format {fmt:?}, {} bytes) is not one oxccl has ({}); pass dtype= to reinterpret the bytes",
                    b.item_size(),
                    names()
                ),
            )
        })?,
    };
    let len = b.len_bytes();
    if len % dt.size_bytes() != 0 {
        return Err(invalid(arg, format!("{len} bytes is not a whole number of {dt} elements")));
    }
    Ok(Buf { ptr: b.buf_ptr() as usize, len, dtype: dt, place: Place::Host })
}

fn tensor(arg: &str, o: &Bound<'_, PyAny>, t: &Torch, dtype: Option<DataType>) -> PyResult<Buf> {
    let py = o.py();
    let tdt = o.getattr(pyo3::intern!(py, "dtype"))?;
    let dt = match dtype {
        Some(d) => d,
        None => match t.dtypes.bind(py).get_item(&tdt)? {
            Some(v) => DataType::from_nccl(v.extract::<i32>()?)
                .ok_or_else(|| invalid(arg, "internal: bad dtype table entry"))?,
            None => {
                return Err(invalid(
                    arg,
                    format!("the tensor's dtype {} is not one oxccl has ({})", tdt.str()?, names()),
                ))
            }
        },
    };
    if !o.call_method0(pyo3::intern!(py, "is_contiguous"))?.extract::<bool>()? {
        return Err(invalid(arg, "the tensor is not contiguous (pass tensor.contiguous())"));
    }
    let len: usize = o.getattr(pyo3::intern!(py, "nbytes"))?.extract()?;
    if len % dt.size_bytes() != 0 {
        return Err(invalid(arg, format!("{len} bytes is not a whole number of {dt} elements")));
    }
    let ptr: usize = o.call_method0(pyo3::intern!(py, "data_ptr"))?.extract()?;
    let place = if o.getattr(pyo3::intern!(py, "is_cpu"))?.extract::<bool>()? {
        Place::Host
    } else if o.getattr(pyo3::intern!(py, "is_cuda"))?.extract::<bool>()? {
        Place::Cuda(o.call_method0(pyo3::intern!(py, "get_device"))?.extract()?)
    } else {
        let dev = o.getattr(pyo3::intern!(py, "device"))?.str()?.to_string();
        return Err(invalid(arg, format!("the tensor is on {dev}; oxccl takes CPU and CUDA tensors")));
    };
    Ok(Buf { ptr, len, dtype: dt, place })
}
