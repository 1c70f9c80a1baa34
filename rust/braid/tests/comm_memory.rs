//! `Comm::mem_alloc` (`braid_comm_mem_alloc` / `braid_comm_mem_free`) and
//! `Comm::register` (`braid_mem_register` / `braid_mem_deregister`) on the
//! host backends (self on one rank, shm on several). Run on every rank of a
//! braidrun job (1 to 4 ranks), one test at a time in name order:
//!
//!     braidrun -n 4 target/debug/deps/comm_memory-HASH --test-threads=1
//!
//! (rust/braid/run_tests.sh does that for `make test`.) On backend nccl
//! with the host-memory stand-in for NCCL (tests/nccl_double, whose "device
//! memory" the host can read; `BT_NCCL_DOUBLE=1`), `device_memory_on_nccl`
//! checks the device side and the host tests return at once.
use std::os::raw::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Once;

use braid::communicator::{Communicator, DType, ReduceOp};
use braid::{Comm, CommBuffer, Config, MemBuffer, Op, Registration, Status};

/// The job's communicator, shared by every test (never dropped).
fn comm() -> &'static Comm {
    static INIT: Once = Once::new();
    static COMM: AtomicPtr<Comm> = AtomicPtr::new(std::ptr::null_mut());
    INIT.call_once(|| COMM.store(Box::into_raw(Box::new(Comm::init().expect("braid init"))), Ordering::SeqCst));
    unsafe { &*COMM.load(Ordering::SeqCst) }
}

/// A world of this process alone.
fn private() -> Comm {
    Comm::init_with(&Config::new().backend("self").rank(0).world_size(1).timeout(30.0)).expect("private comm")
}

/// The line of /proc/self/maps that holds addr.
fn mapping_of(addr: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .find(|l| {
            let range = l.split(' ').next().unwrap();
            let mut it = range.split('-').map(|x| usize::from_str_radix(x, 16).unwrap());
            let (lo, hi) = (it.next().unwrap(), it.next().unwrap());
            lo <= addr && addr < hi
        })
        .map(str::to_string)
}

/// Whether addr lies in a mapping of braid_mem_alloc (a memfd named braid-mem-N).
fn braid_memory_at(addr: usize) -> bool {
    mapping_of(addr).map_or(false, |l| l.contains("braid-mem-"))
}

fn tri(n: usize) -> usize {
    n * (n + 1) / 2
}

#[test]
fn mem_alloc_all_reduce_sums() {
    let c = comm();
    if c.backend() == "nccl" {
        return; // device_memory_on_nccl
    }
    let (r, n) = (c.rank(), c.world_size());

    let mut a: CommBuffer<f64> = c.mem_alloc(3 * 37).unwrap();
    assert!(!a.is_device() && a.len() == 111 && !a.is_empty());
    assert!(a.as_slice().unwrap().iter().all(|&v| v == 0.0)); // zero-filled
    let s = a.as_mut_slice().unwrap();
    s.iter_mut().enumerate().for_each(|(i, v)| *v = ((r + 1) * (i % 7 + 1)) as f64);
    c.all_reduce_in_place(s, Op::Sum).unwrap();
    assert!(a.as_slice().unwrap().iter().enumerate().all(|(i, &v)| v == (tri(n) * (i % 7 + 1)) as f64));

    // 1 MiB: the shm backend's peers read it in place
    let mut b = c.mem_alloc::<f32>(1 << 18).unwrap();
    let s = b.as_mut_slice().unwrap();
    s.iter_mut().enumerate().for_each(|(i, v)| *v = ((r + 1) * (i % 5 + 1)) as f32);
    c.all_reduce_in_place(s, Op::Sum).unwrap();
    let s = b.as_slice().unwrap();
    assert!(s.iter().enumerate().all(|(i, &v)| v == (tri(n) * (i % 5 + 1)) as f32));

    // the reference trait's pointer methods on addr()
    let mut m = c.mem_alloc::<i32>(1001).unwrap();
    m.as_mut_slice().unwrap().fill(r as i32 + 1);
    unsafe { c.all_reduce(m.addr(), m.len(), DType::I32, ReduceOp::Max).unwrap() };
    c.sync().unwrap();
    assert!(m.as_slice().unwrap().iter().all(|&v| v == n as i32));

    // all-gather in place and broadcast out of rank 0's comm memory
    let mut g = c.mem_alloc::<i64>(300 * n).unwrap();
    let s = g.as_mut_slice().unwrap();
    s[300 * r..300 * (r + 1)].iter_mut().enumerate().for_each(|(i, v)| *v = (i * (r + 1)) as i64);
    c.all_gather_in_place(s).unwrap();
    assert!(s.chunks(300).enumerate().all(|(q, blk)| blk.iter().enumerate().all(|(i, &v)| v == (i * (q + 1)) as i64)));
    let mut x = c.mem_alloc::<u8>(1 << 20).unwrap();
    let s = x.as_mut_slice().unwrap();
    if r == 0 {
        s.iter_mut().enumerate().for_each(|(i, v)| *v = (i % 251) as u8);
    }
    c.broadcast_in_place(s, 0).unwrap();
    assert!(s.iter().enumerate().all(|(i, &v)| v == (i % 251) as u8));
    c.barrier().unwrap();
}

#[test]
fn mem_alloc_freed_on_drop_and_by_free() {
    let c = comm();
    if c.backend() == "nccl" {
        return; // host memory only
    }
    let a = c.mem_alloc::<f64>(5000).unwrap();
    let addr = a.as_ptr() as usize;
    let memfd = braid_memory_at(addr); // false only where memfds are unavailable
    drop(a);
    assert!(!braid_memory_at(addr));
    let b = c.mem_alloc::<u16>(3).unwrap();
    let addr = b.as_ptr() as usize;
    assert_eq!(braid_memory_at(addr), memfd);
    b.free().unwrap();
    assert!(!braid_memory_at(addr));
    // zero elements: still an allocation of its own, freed as any other
    let e = c.mem_alloc::<u32>(0).unwrap();
    assert!(e.is_empty() && e.as_slice().unwrap().is_empty());
    // into_raw / from_raw hand it over and back
    let p = c.mem_alloc::<u8>(100).unwrap().into_raw();
    assert_eq!(braid_memory_at(p as usize), memfd);
    let back = unsafe { CommBuffer::from_raw(c, p, 100) };
    back.free().unwrap();
    assert!(!braid_memory_at(p as usize));
    c.barrier().unwrap();
}

#[test]
fn mem_alloc_refusals() {
    let c = comm();
    if c.backend() == "nccl" {
        return; // host memory only
    }
    let e = c.mem_alloc::<u64>(usize::MAX / 4).unwrap_err(); // more bytes than the address space
    assert_eq!(e.status(), Status::InvalidArg);
    assert!(e.message().starts_with("braid_comm_mem_alloc: braid_mem_alloc: size "), "{}", e);
    assert!(e.message().ends_with(&format!("(rank {})", c.rank())), "{}", e);
    let e = c.mem_alloc::<u8>(1 << 62).unwrap_err(); // more than the machine has
    assert_eq!(e.status(), Status::NoMemory, "{}", e);
    assert!(e.message().starts_with("braid_comm_mem_alloc: "), "{}", e);
    assert!(!e.is_fatal());
    let mut ok = c.mem_alloc::<i32>(4).unwrap(); // still usable
    ok.as_mut_slice().unwrap().fill(1);
    c.all_reduce_in_place(ok.as_mut_slice().unwrap(), Op::Sum).unwrap();
    assert_eq!(ok.as_slice().unwrap(), [c.world_size() as i32; 4]);
}

#[test]
fn register_round_trip() {
    let c = comm();
    if c.backend() == "nccl" {
        return; // host memory only
    }
    let (r, n) = (c.rank(), c.world_size());
    let mut x = vec![(r + 1) as f32; 1000];
    let addr = x.as_ptr() as usize;
    let mut reg = c.register(&mut x).unwrap();
    assert!(!reg.handle().is_null());
    assert_eq!(reg.as_ptr() as usize, addr); // dereferences to the Vec
    c.all_reduce_in_place(&mut reg, Op::Sum).unwrap(); // a registered buffer works as any other
    c.all_reduce_in_place(&mut reg[..10], Op::Max).unwrap();
    reg.deregister().unwrap();
    assert!(x.iter().all(|&v| v == tri(n) as f32));

    // comm memory, braid memory and slices register too; drop deregisters
    let mut m = c.mem_alloc::<i64>(4096).unwrap();
    {
        let mut reg = c.register(&mut m).unwrap();
        reg.as_mut_slice().unwrap().fill(r as i64);
        c.all_reduce_in_place(reg.as_mut_slice().unwrap(), Op::Max).unwrap();
    }
    assert!(m.as_slice().unwrap().iter().all(|&v| v == n as i64 - 1));
    let mut mb = MemBuffer::<u8>::zeroed(64).unwrap();
    c.register(&mut mb).unwrap().deregister().unwrap();
    let mut arr = [1u16; 8];
    let reg = c.register(&mut arr[2..]).unwrap();
    assert_eq!(reg.len(), 6);
    let (h, buf) = reg.into_raw(); // still registered
    assert_eq!(buf.len(), 6);
    unsafe { Registration::from_raw(c, h, buf) }.deregister().unwrap();
    c.barrier().unwrap();
}

#[test]
fn register_refusals() {
    let c = comm();
    if c.backend() == "nccl" {
        return; // host memory only
    }
    let mut empty: Vec<f64> = Vec::new();
    let e = c.register(&mut empty).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert!(e.message().starts_with("braid_mem_register: "), "{}", e);
    assert!(e.message().ends_with(&format!("(rank {})", c.rank())), "{}", e);
    let mut v = vec![1u8; 4];
    c.register(&mut v).unwrap().deregister().unwrap(); // still usable
}

#[test]
fn foreign_pointer_and_handle() {
    let c = comm();
    if c.backend() == "nccl" {
        return; // host memory only
    }
    let r = c.rank();
    // the heap's memory, not braid's: braid_comm_mem_free refuses it and frees nothing
    let mut v: Vec<u64> = (0..16).collect();
    let p = v.as_mut_ptr();
    let e = unsafe { CommBuffer::from_raw(c, p, 16) }.free().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    let want = format!(
        "braid_comm_mem_free: braid_mem_free: ptr {:p} was not returned by braid_mem_alloc, or was freed already",
        p
    );
    assert!(e.message().starts_with(&want), "{}", e);
    assert!(e.message().ends_with(&format!("(rank {})", r)) && !e.is_fatal(), "{}", e);
    assert_eq!(v, (0..16).collect::<Vec<u64>>());
    // a handle braid_mem_register did not give
    let bogus = v.as_mut_ptr() as *mut c_void;
    let e = unsafe { Registration::from_raw(c, bogus, &mut v[..]) }.deregister().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert_eq!(
        e.message(),
        format!(
            "braid_mem_deregister: handle {:p} is not one braid_mem_register gave on backend {} (rank {})",
            bogus,
            c.backend(),
            r
        )
    );
    c.barrier().unwrap();
}

#[test]
fn failed_communicator_refuses() {
    let p = private();
    let m = p.mem_alloc::<u8>(3000).unwrap();
    let addr = m.as_ptr() as usize;
    let mut v = vec![0f32; 8];
    let reg = p.register(&mut v).unwrap();
    p.abort().unwrap();
    let mut w = vec![0f32; 8];
    let errors = [
        ("braid_comm_mem_alloc", p.mem_alloc::<f32>(4).map(|_| ()).unwrap_err()),
        ("braid_mem_register", p.register(&mut w).map(|_| ()).unwrap_err()),
        ("braid_mem_deregister", reg.deregister().unwrap_err()),
        ("braid_comm_mem_free", m.free().unwrap_err()),
    ];
    for (call, e) in errors.iter() {
        assert_eq!(e.status(), Status::Aborted, "{}", e);
        assert!(e.message().starts_with(&format!("{}: communicator failed earlier: braid_abort: ", call)), "{}", e);
        assert!(e.is_fatal());
    }
    assert!(!braid_memory_at(addr)); // a failed communicator's host memory is still freed
    drop(p);
    comm().barrier().unwrap();
}

#[test]
fn device_memory_on_nccl() {
    let c = comm();
    if c.backend() != "nccl" || std::env::var("BT_NCCL_DOUBLE").as_deref() != Ok("1") {
        return;
    }
    let (r, n) = (c.rank(), c.world_size());
    let mut m = c.mem_alloc::<f32>(1000).unwrap();
    assert!(m.is_device() && m.len() == 1000 && m.as_slice().is_none() && m.as_mut_slice().is_none());
    // the stand-in's device memory is host memory
    let host = unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr(), 1000) };
    host.iter_mut().enumerate().for_each(|(i, v)| *v = ((r + 1) * (i % 7 + 1)) as f32);
    unsafe { c.all_reduce(m.addr(), m.len(), DType::F32, ReduceOp::Sum).unwrap() };
    c.sync().unwrap();
    let host = unsafe { std::slice::from_raw_parts(m.as_ptr(), 1000) };
    assert!(host.iter().enumerate().all(|(i, &v)| v == (tri(n) * (i % 7 + 1)) as f32));

    let reg = c.register(&mut m).unwrap(); // ncclCommRegister
    let handle = reg.handle();
    assert!(!handle.is_null() && reg.is_device());
    reg.deregister().unwrap();
    // a handle NCCL no longer knows: braid's refusal, nothing else happens
    let e = unsafe { Registration::from_raw(c, handle, &mut m) }.deregister().unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert!(e.message().starts_with("braid_mem_deregister: ncclCommDeregister failed"), "{}", e);
    assert!(e.message().ends_with(&format!("(rank {})", r)) && !e.is_fatal(), "{}", e);
    m.free().unwrap(); // ncclMemFree
    c.barrier().unwrap();
}
