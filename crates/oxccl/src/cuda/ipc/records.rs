//! What the IPC engine's eager and captured paths share of a group's exchange: each rank's
//! records of its collectives and sends (buffers exported), every rank's table of collective
//! records checked alike everywhere, the collectives' tasks over the opened buffers, and a
//! receive checked against its send's record, and the trade of those records. Events are the
//! eager path's own (`mod.rs`).

use super::*;

impl Engine {
    /// `colls`' records (their buffers exported; a buffer that cannot be exported makes its
    /// record not ok) into the first `COLL_REC * colls.len()` bytes of `b`.
    pub(super) fn put_coll_records(&self, colls: &[DevCall], b: &mut [u8]) {
        for (i, c) in colls.iter().enumerate() {
            let (ok, send, recv) = match (self.export_buf(c.send), self.export_buf(c.recv)) {
                (Ok(a), Ok(b)) => (true, a, b),
                _ => (false, NO_EXPORT, NO_EXPORT),
            };
            CollRec { ok, call: *c, send, recv }.encode(&mut b[i * COLL_REC..]);
        }
    }

    /// A send's record for its receiver: ok, type, count, the exported buffer (the event
    /// handle after it is left zero, for the caller).
    pub(super) fn send_record(&self, c: &DevCall) -> Vec<u8> {
        let mut b = vec![0u8; SEND_REC];
        let ex = if c.bytes() == 0 { Ok(NO_EXPORT) } else { self.export_buf(c.send) };
        b[0] = ex.is_ok() as u8;
        b[1] = c.t as u8;
        b[8..16].copy_from_slice(&(c.count as u64).to_le_bytes());
        put_exported(&mut b[16..], &ex.unwrap_or(NO_EXPORT));
        b
    }

    /// Collective `c` (index `i` of the group) as this rank's tasks over every rank's buffers
    /// in `table`, the peers' opened.
    pub(super) fn coll_tasks(
        &self,
        rank: usize,
        table: &[Vec<CollRec>],
        i: usize,
        c: &DevCall,
    ) -> Result<(DevCall, Vec<Task>), CudaError> {
        let bufs = (0..table.len())
            .map(|q| {
                let r = &table[q][i];
                let open = |a: u64, e: &Exported| if q == rank { Ok(a) } else { self.open_buf(e) };
                Ok(Bufs { send: open(c.send, &r.send)?, recv: open(c.recv, &r.recv)? })
            })
            .collect::<Result<Vec<Bufs>, CudaError>>()?;
        let coll = c.collective().expect("collectives only");
        Ok((*c, device::tasks(coll, c.count, c.t.size_bytes(), rank, &bufs)))
    }
}

/// Every rank's collective records from an all-gather of `len`-byte blocks (`all`), checked
/// to agree with this rank's `colls` (the same check on every rank).
pub(super) fn coll_table(
    rank: usize,
    colls: &[DevCall],
    all: &[u8],
    len: usize,
) -> Result<Vec<Vec<CollRec>>, CudaError> {
    let mut table = Vec::new();
    for (q, b) in all.chunks(len.max(1)).enumerate() {
        let recs: Option<Vec<CollRec>> =
            (0..colls.len()).map(|i| CollRec::decode(&b[i * COLL_REC..])).collect();
        let recs = recs.ok_or_else(|| {
            CudaError::Invalid(format!("rank {rank}: rank {q}'s collective record does not decode"))
        })?;
        table.push(recs);
    }
    for (q, recs) in table.iter().enumerate() {
        if let Some((a, b)) = colls.iter().zip(recs).find(|(a, b)| !a.agrees(&b.call)) {
            return Err(CudaError::Invalid(format!(
                "rank {rank}: calls differ: this rank's {} but rank {q}'s {}",
                a.describe(),
                b.call.describe()
            )));
        }
    }
    Ok(table)
}

/// Receive `c` from rank `q` checked against its send's record `rec`: the sender exported its
/// buffer (else the error says `fix`), and the type and count match.
pub(super) fn check_recv(rank: usize, q: usize, c: &DevCall, rec: &[u8], fix: &str) -> Result<(), CudaError> {
    let (ok, t, count) = (rec[0] == 1, DataType::from_nccl(rec[1] as i32), u64_at(rec, 8) as usize);
    if !ok {
        return Err(CudaError::Invalid(format!(
            "rank {rank}: {}: rank {q} could not export its send buffer for CUDA IPC ({fix})",
            c.describe()
        )));
    }
    if (t, count) != (Some(c.t), c.count) {
        let tn = t.map_or(format!("type {}", rec[1]), |t| t.to_string());
        return Err(CudaError::Invalid(format!(
            "rank {rank}: {}, but rank {q}'s matching send is of {count} x {tn}",
            c.describe()
        )));
    }
    Ok(())
}

/// A group's records traded in `g` (the first part of its exchange, alike on both paths):
/// `mine` all-gathered into `all` when the group has collectives, each send's record
/// (`send_recs`) to its receiver, each receive's record from its sender into `got`.
#[allow(clippy::too_many_arguments)]
pub(super) fn trade_records<'a>(
    g: &mut crate::Group<'a>,
    (mine, all, colls): (&'a [u8], &'a mut [u8], bool),
    sends: &[DevCall],
    send_recs: &'a [Vec<u8>],
    recvs: &[DevCall],
    got: &'a mut [Vec<u8>],
) -> Result<(), DevError> {
    if colls {
        g.all_gather_raw(DataType::U8, mine, all).map_err(comm_err)?;
    }
    for (c, rec) in sends.iter().zip(send_recs) {
        let What::Send(q) = c.what else { continue };
        g.send_raw(DataType::U8, rec, Rank::new(q)).map_err(comm_err)?;
    }
    for (c, rec) in recvs.iter().zip(got.iter_mut()) {
        let What::Recv(q) = c.what else { continue };
        g.recv_raw(DataType::U8, rec, Rank::new(q)).map_err(comm_err)?;
    }
    Ok(())
}
