//! Errors: braid's status and its sentence.
use std::ffi::CStr;
use std::fmt;

use crate::ffi;

/// `braid_status`, less `BRAID_OK`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// A bad argument; nothing was done and the communicator stays usable.
    InvalidArg,
    /// A meaningless dtype/op pair, or a feature the backend lacks.
    Unsupported,
    NoMemory,
    /// A blocking call waited longer than the timeout (fatal).
    Timeout,
    /// Another rank died, disconnected, failed or aborted (fatal).
    PeerLost,
    /// `abort` was called on this communicator (fatal).
    Aborted,
    /// A message's size or type differs from the receive's (not fatal), or the
    /// ranks made different collective calls (fatal).
    Mismatch,
    /// Ranks could not find each other, or bad launcher settings.
    Bootstrap,
    /// An operating-system call failed.
    System,
    /// The underlying library (MPI, NCCL, CUDA) reported an error.
    Backend,
    /// A bug in braid (fatal).
    Internal,
    /// A status this crate does not know (a newer library).
    Other(i32),
}

impl Status {
    /// The status of a non-zero `braid_status` code.
    pub fn from_code(code: i32) -> Status {
        match code {
            1 => Status::InvalidArg,
            2 => Status::Unsupported,
            3 => Status::NoMemory,
            4 => Status::Timeout,
            5 => Status::PeerLost,
            6 => Status::Aborted,
            7 => Status::Mismatch,
            8 => Status::Bootstrap,
            9 => Status::System,
            10 => Status::Backend,
            11 => Status::Internal,
            c => Status::Other(c),
        }
    }

    /// The `braid_status` code.
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArg => 1,
            Status::Unsupported => 2,
            Status::NoMemory => 3,
            Status::Timeout => 4,
            Status::PeerLost => 5,
            Status::Aborted => 6,
            Status::Mismatch => 7,
            Status::Bootstrap => 8,
            Status::System => 9,
            Status::Backend => 10,
            Status::Internal => 11,
            Status::Other(c) => c,
        }
    }
}

/// A failed braid call: its status and braid's sentence, which names the
/// call, the argument and the rank, e.g.
/// `braid_broadcast: root 7 out of range for world size 4 (rank 2)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

/// `Result` with braid's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error with this status and sentence.
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error { status, message: message.into() }
    }

    /// The error braid reported for `code`: `braid_last_error(comm)` (comm
    /// NULL: this thread's last error). Call it on the thread that made the
    /// failing call, before any other braid call.
    pub(crate) fn last(code: ffi::braid_status, comm: *const ffi::braid_comm) -> Error {
        let msg = unsafe {
            let p = ffi::braid_last_error(comm);
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        Error { status: Status::from_code(code), message: msg }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// braid's sentence.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether the communicator is failed after this error: every later call
    /// on it fails at once with the same status (release it by dropping it).
    /// Resource, system and backend errors are fatal when a collective raised
    /// them; this reports them as not fatal.
    pub fn is_fatal(&self) -> bool {
        match self.status {
            Status::Timeout | Status::PeerLost | Status::Aborted | Status::Internal => true,
            Status::Mismatch => !self.message.contains("but the receive expects"),
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// `Ok(())` for `BRAID_OK`, else the error braid reported.
pub(crate) fn check(code: ffi::braid_status, comm: *const ffi::braid_comm) -> Result<()> {
    if code == ffi::BRAID_OK {
        Ok(())
    } else {
        Err(Error::last(code, comm))
    }
}
