//! Growing a communicator, and the memory it holds.
//!
//! Growth: the existing ranks call [`Communicator::grow`] together (one of them passes the id
//! it made with [`crate::new_unique_id`], the others none), new ranks join that id with
//! [`Communicator::init`] as ranks `size..new_size`. The existing ranks keep their ranks. The
//! id travels from its rank to the others in an all-gather on the old communicator, so every
//! existing rank sees the same answer and fails alike when no rank, or several, passed one.
//!
//! Memory: [`Communicator::memory`] reports what the engine holds; the releasable part can be
//! given back between calls ([`Communicator::release_memory`]) and is rebuilt on demand.

use super::{lock, Communicator};
use crate::engine::Memory;
use crate::error::{Error, Result};
use oxccl_core::uniqueid::{UniqueId, UNIQUE_ID_BYTES};
use oxccl_core::CoreError;

impl Communicator {
    /// Grows the communicator to `size` ranks: a new communicator in which this rank keeps
    /// its rank and ranks `self.size()..size` are new ones that joined `id` with
    /// [`Communicator::init`]. Every existing rank calls it; exactly one passes `Some(id)`.
    pub fn grow(&self, size: usize, id: Option<&UniqueId>) -> Result<Communicator> {
        if size <= self.size() {
            return Err(Error::Invalid(CoreError::InvalidArgument {
                arg: "size",
                reason: format!(
                    "grow to {size} ranks: the communicator already has {} (a grown one has more)",
                    self.size()
                ),
            }));
        }
        let mut mine = vec![0u8; 1 + UNIQUE_ID_BYTES];
        if let Some(id) = id {
            mine[0] = 1;
            mine[1..].copy_from_slice(&id.to_bytes());
        }
        let mut all = vec![0u8; mine.len() * self.size()];
        self.all_gather(&mine, &mut all)?;
        let holders: Vec<usize> = (0..self.size()).filter(|r| all[r * mine.len()] == 1).collect();
        let from = match holders.as_slice() {
            [one] => *one,
            [] => {
                return Err(Error::InvalidUsage(
                    "grow: no existing rank passed the unique id (the rank that made it must pass it)".into(),
                ))
            }
            many => {
                return Err(Error::InvalidUsage(format!(
                    "grow: ranks {many:?} each passed a unique id (exactly one existing rank passes it)"
                )))
            }
        };
        let at = from * mine.len() + 1;
        let id = UniqueId::from_bytes(&all[at..at + UNIQUE_ID_BYTES])?;
        Communicator::init(&id, size, self.rank(), self.config().clone())
    }

    /// The memory this rank holds for the communicator (see [`Memory`]).
    pub fn memory(&self) -> Memory {
        lock(&self.inner.engine).memory()
    }

    /// Gives back the releasable memory (scratch, working vectors, peers' allocations mapped
    /// for the zero-copy path) after the calls queued before it; later calls rebuild what
    /// they need. Connections stay.
    pub fn release_memory(&self) -> Result<()> {
        self.inner.check_usable()?;
        let _turn = self.inner.take_turn();
        lock(&self.inner.engine).release();
        Ok(())
    }
}
