//! braid from Rust: a safe [`Comm`] over libbraid, and an implementation of
//! the reference [`Communicator`] and [`StreamSyncOps`] traits.
//!
//! ```no_run
//! use braid::{Comm, Op};
//!
//! fn main() -> braid::Result<()> {
//!     let comm = Comm::init()?; // rank, size, backend from braidrun (or torchrun, Slurm, mpirun)
//!     let mut grad = vec![comm.rank() as f32; 1000];
//!     comm.all_reduce_in_place(&mut grad, Op::Avg)?; // bitwise-identical on every rank
//!     Ok(())
//! }
//! ```
//!
//! Run it with `braidrun -n 4 target/debug/my_program`.
//!
//! Code written against the reference traits (numr's
//! `runtime::communicator`) takes a [`Comm`] as a `Box<dyn Communicator>` or
//! an `Arc<dyn Communicator>`; their declarations live in [`communicator`],
//! so such code compiles unchanged with its `use` lines pointed there:
//!
//! ```no_run
//! use braid::communicator::{Communicator, DType, ReduceOp, Result};
//!
//! fn average(c: &dyn Communicator, grads: &mut [f32]) -> Result<()> {
//!     unsafe { c.all_reduce(grads.as_mut_ptr() as u64, grads.len(), DType::F32, ReduceOp::Sum)? };
//!     c.sync()?;
//!     let n = c.world_size() as f32;
//!     grads.iter_mut().for_each(|g| *g /= n);
//!     Ok(())
//! }
//!
//! let comm: Box<dyn Communicator> = Box::new(braid::Comm::init().unwrap());
//! let mut g = vec![1.0f32; 10];
//! average(&*comm, &mut g).unwrap();
//! ```
//!
//! The buffers of [`Exchange`] live at least as long as the exchange, so a
//! receive into a buffer that dies first does not compile:
//!
//! ```compile_fail
//! # let comm = braid::Comm::init().unwrap();
//! comm.exchange(|x| {
//!     let mut local = vec![0u8; 4];
//!     x.recv(&mut local, 0, 0) // error: `local` does not live long enough
//! }).unwrap();
//! ```
//!
//! Linking: the build script finds libbraid through `BRAID_LIB_DIR` (the
//! directory holding `libbraid.so`), else `pkg-config braid`, else the
//! linker's default path; see docs/RUST.md.

pub mod comm;
pub mod communicator;
pub mod dtype;
pub mod error;
pub mod ffi;
pub mod mem;

pub use comm::{Comm, Config, Exchange, Op};
pub use communicator::{Communicator, ReduceOp, StreamSyncOps};
pub use dtype::{Bool, Complex128, Complex64, DType, Element, BF16, F16, FP8E4M3, FP8E5M2};
pub use error::{Error, Result, Status};
pub use mem::{CommBuffer, MemBuffer, Registrable, Registration};

/// The version of the libbraid in use ("MAJOR.MINOR.PATCH").
pub fn library_version() -> String {
    unsafe { std::ffi::CStr::from_ptr(ffi::braid_version()).to_string_lossy().into_owned() }
}
