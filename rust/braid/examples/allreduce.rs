//! All-reduce on every rank, through the safe API and through the reference
//! trait, and check the results.
//!
//!     cargo build --examples   # BRAID_LIB_DIR=../../build
//!     braidrun -n 4 $CARGO_TARGET_DIR/debug/examples/allreduce
use std::sync::Arc;

use braid::communicator::{Communicator, DType, ReduceOp};
use braid::{Comm, Op};

fn main() -> braid::Result<()> {
    let comm = Comm::init()?;
    let (rank, size) = (comm.rank(), comm.world_size());

    // safe API: slices, complete on return
    let mut x: Vec<f32> = (0..1000).map(|i| (i + rank) as f32).collect();
    comm.all_reduce_in_place(&mut x, Op::Sum)?;
    let wrong = x.iter().enumerate().filter(|&(i, &v)| v != (size * i) as f32 + (size * (size - 1) / 2) as f32).count();

    // the reference trait, as code written against numr's Communicator uses it
    let c: Arc<dyn Communicator> = Arc::new(comm);
    let mut g = vec![1.0f64; 16];
    unsafe { c.all_reduce(g.as_mut_ptr() as u64, g.len(), DType::F64, ReduceOp::Sum)? };
    c.sync()?;
    let wrong = wrong + g.iter().filter(|&&v| v != size as f64).count();

    println!("rank {} of {}: all-reduce of 1000 f32 and 16 f64, {} wrong", rank, size, wrong);
    std::process::exit(if wrong == 0 { 0 } else { 1 });
}
