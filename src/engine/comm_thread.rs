//! A thread that owns a communicator and runs collectives in the order they
//! are submitted, so communication overlaps the computation of the thread
//! that submits them (DDP's bucket all-reduces during backward). Every rank
//! submits the same jobs in the same order; the thread keeps that order.

use crate::dist::Communicator;
use crate::error::{Error, Result};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce(&mut dyn Communicator) + Send>;

/// The communication thread and the way to hand it work.
pub struct CommThread {
    tx: Option<Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    rank: usize,
}

/// The answer to one submitted job.
pub struct Pending<T> {
    rx: Receiver<Result<T>>,
    rank: usize,
    op: &'static str,
}

impl<T> Pending<T> {
    /// Waits for the job's result.
    pub fn wait(self) -> Result<T> {
        self.rx.recv().map_err(|_| Error::dist(self.op, self.rank, "the communication thread stopped before answering"))?
    }
}

impl CommThread {
    /// Moves `comm` onto a new thread.
    pub fn start(comm: Box<dyn Communicator>) -> Result<CommThread> {
        let rank = comm.rank();
        let (tx, rx) = channel::<Job>();
        let handle = std::thread::Builder::new()
            .name(format!("comm-rank{rank}"))
            .spawn(move || {
                let mut comm = comm;
                while let Ok(job) = rx.recv() {
                    job(comm.as_mut());
                }
            })
            .map_err(|e| Error::dist("start", rank, format!("cannot start the communication thread: {e}")))?;
        Ok(CommThread { tx: Some(tx), handle: Some(handle), rank })
    }

    /// Queues `f` after every job submitted before it; its result comes back through the returned handle.
    pub fn submit<T: Send + 'static>(&self, op: &'static str, f: impl FnOnce(&mut dyn Communicator) -> Result<T> + Send + 'static) -> Result<Pending<T>> {
        let (rtx, rrx) = channel();
        let job: Job = Box::new(move |c| {
            // The receiver may be gone (an engine dropped mid-step); nothing then waits for the answer.
            let _ = rtx.send(f(c));
        });
        let tx = self.tx.as_ref().ok_or_else(|| Error::dist(op, self.rank, "the communication thread was shut down"))?;
        tx.send(job).map_err(|_| Error::dist(op, self.rank, "the communication thread stopped (a collective failed earlier)"))?;
        Ok(Pending { rx: rrx, rank: self.rank, op })
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop once queued jobs have run.
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
