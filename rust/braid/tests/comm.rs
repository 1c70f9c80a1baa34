//! Run on every rank of a braidrun job (1 to 4 ranks), one test at a time in
//! name order, so every rank makes the same calls in the same order:
//!
//!     braidrun -n 4 target/debug/deps/comm-HASH --test-threads=1
//!
//! (rust/braid/run_tests.sh does that for `make test`.) Run alone, a test
//! binary is a world of one.
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Once};
use std::thread;
use std::time::{Duration, Instant};

use braid::communicator::{Communicator, DType, ReduceOp, StreamSyncOps};
use braid::{Bool, Comm, Complex128, Complex64, Config, Element, MemBuffer, Op, Status, BF16, F16, FP8E4M3};

/// The job's communicator, shared by every test (never dropped).
fn comm() -> &'static Comm {
    static INIT: Once = Once::new();
    static COMM: AtomicPtr<Comm> = AtomicPtr::new(std::ptr::null_mut());
    INIT.call_once(|| COMM.store(Box::into_raw(Box::new(Comm::init().expect("braid init"))), Ordering::SeqCst));
    unsafe { &*COMM.load(Ordering::SeqCst) }
}

/// A world of this process alone, with a short timeout.
fn private(timeout: f64) -> Comm {
    Comm::init_with(&Config::new().backend("self").rank(0).world_size(1).timeout(timeout)).expect("private comm")
}

/// Every rank's bytes of a slice, gathered; panics unless all ranks hold the same bytes.
fn assert_same_on_every_rank<T: Element>(c: &Comm, v: &[T]) {
    let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) };
    let mut all = vec![0u8; bytes.len() * c.world_size()];
    c.all_gather_into(bytes, &mut all).unwrap();
    for (r, block) in all.chunks(bytes.len()).enumerate() {
        assert_eq!(block, bytes, "rank {}'s bytes differ from rank {}'s", r, c.rank());
    }
}

/// small exact values: (r + 1) * (i % 5 + 1), negative on odd i for signed types
fn val(r: usize, i: usize, signed: bool) -> i64 {
    let v = ((r + 1) * (i % 5 + 1)) as i64;
    if signed && i % 2 == 1 {
        -v
    } else {
        v
    }
}

const N: usize = 37;

fn f16_of_small_int(v: i64) -> F16 {
    // exact for |v| < 2048: sign, exponent, 10-bit mantissa
    if v == 0 {
        return F16(0);
    }
    let (s, a) = if v < 0 { (0x8000u16, (-v) as u32) } else { (0, v as u32) };
    let e = 31 - a.leading_zeros(); // floor(log2)
    let mant = ((a << (10 - e)) & 0x3ff) as u16;
    F16(s | (((e + 15) as u16) << 10) | mant)
}

#[test]
fn all_reduce_sum_every_dtype() {
    let c = comm();
    let (r, w) = (c.rank(), c.world_size());
    let sum = |i: usize, signed: bool| (0..w).map(|q| val(q, i, signed)).sum::<i64>();

    macro_rules! ints {
        ($($t:ty, $signed:expr);*) => {$(
            let mut x: Vec<$t> = (0..N).map(|i| val(r, i, $signed) as $t).collect();
            c.all_reduce_in_place(&mut x, Op::Sum).unwrap();
            let want: Vec<$t> = (0..N).map(|i| sum(i, $signed) as $t).collect();
            assert_eq!(x, want, "{}", <$t as Element>::DTYPE);
        )*};
    }
    ints!(i64, true; i32, true; i16, true; i8, true; u64, false; u32, false; u16, false; u8, false);

    let mut f: Vec<f64> = (0..N).map(|i| val(r, i, true) as f64).collect();
    c.all_reduce_in_place(&mut f, Op::Sum).unwrap();
    assert!(f.iter().enumerate().all(|(i, &v)| v == sum(i, true) as f64));
    let mut f: Vec<f32> = (0..N).map(|i| val(r, i, true) as f32).collect();
    c.all_reduce_in_place(&mut f, Op::Sum).unwrap();
    assert!(f.iter().enumerate().all(|(i, &v)| v == sum(i, true) as f32));

    let mut h: Vec<F16> = (0..N).map(|i| f16_of_small_int(val(r, i, true))).collect();
    c.all_reduce_in_place(&mut h, Op::Sum).unwrap();
    let want: Vec<F16> = (0..N).map(|i| f16_of_small_int(sum(i, true))).collect();
    assert_eq!(h, want);

    let mut b: Vec<BF16> = (0..N).map(|i| BF16::from_f32(val(r, i, true) as f32)).collect();
    c.all_reduce_in_place(&mut b, Op::Sum).unwrap();
    let want: Vec<BF16> = (0..N).map(|i| BF16::from_f32(sum(i, true) as f32)).collect();
    assert_eq!(b, want);

    // FP8 E4M3: 1.0 is 0x38; a sum of w ones is w (2.0 = 0x40, 3.0 = 0x44, 4.0 = 0x48)
    let mut e = vec![FP8E4M3(0x38); 9];
    c.all_reduce_in_place(&mut e, Op::Sum).unwrap();
    assert!(e.iter().all(|&v| v == FP8E4M3([0u8, 0x38, 0x40, 0x44, 0x48][w])));

    let mut z: Vec<Complex64> = (0..N).map(|i| Complex64::new(val(r, i, true) as f32, r as f32 - i as f32)).collect();
    c.all_reduce_in_place(&mut z, Op::Sum).unwrap();
    let rs = (w * (w - 1) / 2) as f32;
    assert!(z.iter().enumerate().all(|(i, v)| v.re == sum(i, true) as f32 && v.im == rs - (w * i) as f32));
    let mut z: Vec<Complex128> = (0..N).map(|_| Complex128::new(1.0, -(r as f64))).collect();
    c.all_reduce_in_place(&mut z, Op::Sum).unwrap();
    assert!(z.iter().all(|v| v.re == w as f64 && v.im == -((w * (w - 1) / 2) as f64)));

    // bool: SUM is OR; any non-zero byte is true, results are 0 or 1
    let mut t: Vec<Bool> = (0..N).map(|i| Bool(if (i + r) % 3 == 0 { 0x80 } else { 0 })).collect();
    c.all_reduce_in_place(&mut t, Op::Sum).unwrap();
    let want: Vec<Bool> = (0..N).map(|i| Bool((0..w).any(|q| (i + q) % 3 == 0) as u8)).collect();
    assert_eq!(t, want);
    c.barrier().unwrap();
}

#[test]
fn all_reduce_every_op_on_i32() {
    let c = comm();
    let (r, w) = (c.rank(), c.world_size());
    let ins: Vec<Vec<i32>> = (0..w).map(|q| (0..N).map(|i| val(q, i, true) as i32).collect()).collect();
    let fold = |f: &dyn Fn(i32, i32) -> i32| -> Vec<i32> {
        (0..N).map(|i| ins.iter().skip(1).fold(ins[0][i], |a, v| f(a, v[i]))).collect()
    };
    let cases: Vec<(Op, Vec<i32>)> = vec![
        (Op::Sum, fold(&|a, b| a.wrapping_add(b))),
        (Op::Prod, fold(&|a, b| a.wrapping_mul(b))),
        (Op::Min, fold(&|a, b| a.min(b))),
        (Op::Max, fold(&|a, b| a.max(b))),
        (Op::Avg, fold(&|a, b| a.wrapping_add(b)).iter().map(|s| s / w as i32).collect()),
        (Op::BAnd, fold(&|a, b| a & b)),
        (Op::BOr, fold(&|a, b| a | b)),
        (Op::BXor, fold(&|a, b| a ^ b)),
    ];
    for (op, want) in cases {
        let mut x = ins[r].clone();
        c.all_reduce_in_place(&mut x, op).unwrap();
        assert_eq!(x, want, "{:?}", op);
    }
    c.barrier().unwrap();
}

#[test]
fn all_reduce_bitwise_identical() {
    let c = comm();
    // a different pseudo-random f32 vector per rank, with sums that round
    let mut s = 0x9e3779b97f4a7c15u64 ^ (c.rank() as u64 + 1);
    let mut x: Vec<f32> = (0..10007)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * [1e-3f32, 1.0, 1e3][(s % 3) as usize]
        })
        .collect();
    let mut y = x.clone();
    c.all_reduce_in_place(&mut x, Op::Sum).unwrap();
    assert_same_on_every_rank(c, &x);
    c.all_reduce_in_place(&mut y, Op::Avg).unwrap();
    assert_same_on_every_rank(c, &y);
    let mut h: Vec<BF16> = x.iter().map(|&v| BF16::from_f32(v)).collect();
    c.all_reduce_in_place(&mut h, Op::Sum).unwrap();
    assert_same_on_every_rank(c, &h);
    c.barrier().unwrap();
}

#[test]
fn broadcast_every_root() {
    let c = comm();
    for root in 0..c.world_size() {
        let mut x: Vec<u16> = (0..1000).map(|i| (i * (c.rank() + 1) + c.rank()) as u16).collect();
        c.broadcast_in_place(&mut x, root).unwrap();
        assert!(x.iter().enumerate().all(|(i, &v)| v == (i * (root + 1) + root) as u16));
    }
    c.barrier().unwrap();
}

#[test]
fn all_gather_and_reduce_scatter() {
    let c = comm();
    let (r, w) = (c.rank(), c.world_size());
    let send: Vec<f64> = (0..N).map(|i| (i + 100 * r) as f64).collect();
    let mut recv = vec![0f64; N * w];
    c.all_gather_into(&send, &mut recv).unwrap();
    for q in 0..w {
        assert!(recv[q * N..(q + 1) * N].iter().enumerate().all(|(i, &v)| v == (i + 100 * q) as f64));
    }
    let mut inplace = vec![-1i64; 3 * w];
    inplace[r * 3..(r + 1) * 3].copy_from_slice(&[r as i64, 10 * r as i64, 100 * r as i64]);
    c.all_gather_in_place(&mut inplace).unwrap();
    for q in 0..w {
        assert_eq!(&inplace[q * 3..(q + 1) * 3], &[q as i64, 10 * q as i64, 100 * q as i64]);
    }

    let full: Vec<i32> = (0..5 * w).map(|i| i as i32 * (r as i32 + 1)).collect();
    let mut part = vec![0i32; 5];
    c.reduce_scatter_into(&full, &mut part, Op::Sum).unwrap();
    let tot = (w * (w + 1) / 2) as i32;
    assert!(part.iter().enumerate().all(|(i, &v)| v == (r * 5 + i) as i32 * tot));
    let mut buf: Vec<u8> = (0..4 * w).map(|i| (i % 7) as u8 + r as u8).collect();
    c.reduce_scatter_in_place(&mut buf, Op::Max).unwrap();
    assert!(buf[r * 4..(r + 1) * 4].iter().enumerate().all(|(i, &v)| v == ((r * 4 + i) % 7) as u8 + (w - 1) as u8));

    // wrong sizes: braid's style of sentence, nothing sent
    let e = c.all_gather_into(&send, &mut recv[1..]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert_eq!(
        e.message(),
        format!(
            "braid_all_gather: recv holds {} elements of f64 but must hold {} ({} ranks x {}) (rank {})",
            N * w - 1,
            N * w,
            w,
            N,
            r
        )
    );
    c.barrier().unwrap();
}

#[test]
fn rooted_collectives_and_all_to_all() {
    let c = comm();
    let (r, w) = (c.rank(), c.world_size());
    for root in 0..w {
        // reduce: sum of (q + 1) * (i % 5 + 1) with signs, into the root's recv
        let send: Vec<i32> = (0..N).map(|i| val(r, i, true) as i32).collect();
        let mut recv = vec![0i32; N];
        c.reduce_into(&send, if r == root { Some(&mut recv[..]) } else { None }, Op::Max, root).unwrap();
        if r == root {
            let want: Vec<i32> = (0..N).map(|i| (0..w).map(|q| val(q, i, true) as i32).max().unwrap()).collect();
            assert_eq!(recv, want, "reduce to root {}", root);
        }
        let mut x: Vec<f64> = (0..N).map(|i| (r * N + i) as f64).collect();
        c.reduce_in_place(&mut x, Op::Sum, root).unwrap();
        if r == root {
            assert!(x.iter().enumerate().all(|(i, &v)| v == (0..w).map(|q| (q * N + i) as f64).sum::<f64>()));
        } else {
            assert!(x.iter().enumerate().all(|(i, &v)| v == (r * N + i) as f64), "send written on rank {}", r);
        }

        // gather: rank q's block is 1000 q + i + root
        let send: Vec<u16> = (0..N).map(|i| (1000 * r + i + root) as u16).collect();
        let mut all = vec![0u16; N * w];
        c.gather_into(&send, if r == root { Some(&mut all[..]) } else { None }, root).unwrap();
        if r == root {
            let want: Vec<u16> = (0..w).flat_map(|q| (0..N).map(move |i| (1000 * q + i + root) as u16)).collect();
            assert_eq!(all, want, "gather to root {}", root);
        }

        // scatter: block q of the root's send goes to rank q
        let src: Vec<i64> = (0..N * w).map(|i| (i + 7 * root) as i64).collect();
        let mut mine = vec![-1i64; N];
        c.scatter_into(if r == root { Some(&src[..]) } else { None }, &mut mine, root).unwrap();
        assert_eq!(mine, src[r * N..(r + 1) * N].to_vec(), "scatter from root {}", root);
    }

    // all-to-all: block j of rank i holds 100 i + j; afterwards block i of rank j does
    let send: Vec<i64> = (0..w).flat_map(|j| std::iter::repeat((100 * r + j) as i64).take(5)).collect();
    let mut recv = vec![0i64; 5 * w];
    c.all_to_all_into(&send, &mut recv).unwrap();
    let want: Vec<i64> = (0..w).flat_map(|i| std::iter::repeat((100 * i + r) as i64).take(5)).collect();
    assert_eq!(recv, want);
    let mut buf = send.clone();
    c.all_to_all_in_place(&mut buf).unwrap();
    assert_eq!(buf, want);

    // mistakes every rank makes alike fail before the call, and the communicator goes on
    let e = c.reduce_into(&send, Some(&mut recv[..]), Op::Sum, w + 2).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert_eq!(e.message(), format!("braid_reduce: root {} out of range for world size {} (rank {})", w + 2, w, r));
    let e = c.gather_into(&send[..3], Some(&mut recv[..]), r).unwrap_err();
    assert_eq!(
        e.message(),
        format!("braid_gather: recv holds {} elements of i64 but must hold {} ({} ranks x 3) (rank {})", 5 * w, 3 * w, w, r)
    );
    let e = c.scatter_into::<i64>(None, &mut recv[..2], r).unwrap_err();
    assert_eq!(e.message(), format!("braid_scatter: send is None at the root (rank {})", r));
    let e = c.all_to_all_into(&send, &mut recv[..5 * w - 1]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    c.barrier().unwrap();
}

#[test]
fn exchange_ring() {
    let c = comm();
    let (r, w) = (c.rank(), c.world_size());
    let out: Vec<i64> = vec![r as i64; 5000];
    let mut got = vec![0i64; 5000];
    let mut got2 = vec![0u8; 3];
    c.exchange(|x| {
        x.send(&out, (r + 1) % w, 7)?;
        x.send(&[1u8, 2, 3][..], (r + w - 1) % w, 8)?;
        x.recv(&mut got, (r + w - 1) % w, 7)?;
        x.recv(&mut got2, (r + 1) % w, 8)
    })
    .unwrap();
    assert!(got.iter().all(|&v| v == ((r + w - 1) % w) as i64));
    assert_eq!(got2, [1, 2, 3]);
    c.barrier().unwrap();
}

#[test]
fn exchange_recv_shape_mismatch() {
    let c = comm();
    let (r, w) = (c.rank(), c.world_size());
    let three = [1.0f64, 2.0, 3.0];
    c.exchange(|x| x.send(&three, (r + 1) % w, 5)).unwrap();
    c.barrier().unwrap(); // the message has arrived
    let mut two = [0f64; 2];
    let e = c.exchange(|x| x.recv(&mut two, (r + w - 1) % w, 5)).unwrap_err();
    assert_eq!(e.status(), Status::Mismatch);
    assert!(!e.is_fatal());
    assert_eq!(
        e.message(),
        format!(
            "braid_recv: message from rank {} with tag 5 has 3 elements of f64 (24 bytes) but the receive expects 2 \
             elements of f64 (16 bytes) (rank {})",
            (r + w - 1) % w,
            r
        )
    );
    let mut right = [0f64; 3];
    c.exchange(|x| x.recv(&mut right, (r + w - 1) % w, 5)).unwrap();
    assert_eq!(right, three);
    c.barrier().unwrap();
}

#[test]
fn trait_object_collectives_and_p2p() {
    let c: &dyn Communicator = comm();
    let (r, w) = (c.rank(), c.world_size());
    assert_eq!((r, w), (comm().rank(), comm().world_size()));
    let mut x = vec![(r + 1) as f32; 64];
    unsafe { c.all_reduce(x.as_mut_ptr() as u64, x.len(), DType::F32, ReduceOp::Sum).unwrap() };
    c.sync().unwrap();
    assert!(x.iter().all(|&v| v == (w * (w + 1) / 2) as f32));

    let mut y = vec![r as u32; 16];
    unsafe { c.broadcast(y.as_mut_ptr() as u64, y.len(), DType::U32, w - 1).unwrap() };
    c.sync().unwrap();
    assert!(y.iter().all(|&v| v == (w - 1) as u32));

    let send = [r as i16; 4];
    let mut recv = vec![0i16; 4 * w];
    unsafe { c.all_gather(send.as_ptr() as u64, recv.as_mut_ptr() as u64, 4, DType::I16).unwrap() };
    let full = vec![1i16; 2 * w];
    let mut part = vec![0i16; 2];
    unsafe { c.reduce_scatter(full.as_ptr() as u64, part.as_mut_ptr() as u64, 2, DType::I16, ReduceOp::Max).unwrap() };
    c.sync().unwrap();
    assert!(recv.chunks(4).enumerate().all(|(q, b)| b.iter().all(|&v| v == q as i16)));
    assert_eq!(part, [1, 1]);

    let out = vec![r as u64 * 3; 100];
    let mut inp = vec![0u64; 100];
    unsafe {
        c.recv(inp.as_mut_ptr() as u64, inp.len(), DType::U64, (r + w - 1) % w, 42).unwrap();
        c.send(out.as_ptr() as u64, out.len(), DType::U64, (r + 1) % w, 42).unwrap();
    }
    c.barrier().unwrap(); // implies sync
    assert!(inp.iter().all(|&v| v == ((r + w - 1) % w) as u64 * 3));

    // errors through the trait
    let e = unsafe { c.broadcast(y.as_mut_ptr() as u64, y.len(), DType::U32, w + 6) }.unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert_eq!(
        e.to_string(),
        format!("braid_broadcast: root {} out of range for world size {} (rank {})", w + 6, w, r)
    );
    c.barrier().unwrap();
}

#[test]
fn trait_split_and_stream_sync() {
    let c: &dyn Communicator = comm();
    let (r, w) = (c.rank(), c.world_size());
    let sub = c.split((r % 2) as u32, (w - r) as u32).unwrap().expect("braid splits on every backend");
    let members: Vec<usize> = (0..w).filter(|q| q % 2 == r % 2).collect();
    assert_eq!(sub.world_size(), members.len());
    assert_eq!(sub.rank(), members.iter().rev().position(|&q| q == r).unwrap());
    let mut v = [r as i64];
    unsafe { sub.all_reduce(v.as_mut_ptr() as u64, 1, DType::I64, ReduceOp::Sum).unwrap() };
    sub.sync().unwrap();
    assert_eq!(v[0], members.iter().sum::<usize>() as i64);
    drop(sub);

    // BRAID_SPLIT_NONE: rank 0 joins nothing
    let none = c.split(if r == 0 { u32::MAX } else { 1 }, 0).unwrap();
    assert_eq!(none.is_none(), r == 0);
    if let Some(s) = &none {
        assert_eq!((s.rank(), s.world_size()), (r - 1, w - 1));
    }
    drop(none);

    // no communication stream on the CPU backends
    assert!(c.as_stream_sync().is_none());
    let e = StreamSyncOps::create_event(comm()).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
    assert!(e.message().contains(comm().backend()), "{}", e);
    assert_eq!(comm().sync_comm_stream().unwrap_err().status(), Status::Unsupported);
    c.barrier().unwrap();
}

#[test]
fn send_sync_arc_across_threads() {
    fn is_send_sync<T: Send + Sync + ?Sized>() {}
    is_send_sync::<Comm>();
    is_send_sync::<dyn Communicator>();
    let c = comm();
    let sub: Arc<dyn Communicator> = Arc::from(c.split(0, c.rank() as u32).unwrap().unwrap());
    let t = {
        let sub = Arc::clone(&sub);
        thread::spawn(move || {
            let mut x = vec![1.0f64; 8];
            unsafe { sub.all_reduce(x.as_mut_ptr() as u64, 8, DType::F64, ReduceOp::Sum).unwrap() };
            sub.sync().unwrap();
            x
        })
    };
    let x = t.join().unwrap();
    assert!(x.iter().all(|&v| v == sub.world_size() as f64));
    drop(sub);
    c.barrier().unwrap();
}

#[test]
fn errors_unsupported_pair_and_timeout() {
    let c = comm();
    let mut f = vec![1.0f32; 4];
    let e = c.all_reduce_in_place(&mut f, Op::BAnd).unwrap_err();
    assert_eq!(e.status(), Status::Unsupported);
    assert!(e.message().starts_with("braid_all_reduce: ") && e.message().ends_with(&format!("(rank {})", c.rank())));
    assert_eq!(f, [1.0; 4]); // a rejected call does nothing

    let p = private(0.2);
    let mut x = [0u8; 4];
    let t0 = Instant::now();
    let e = p.exchange(|xc| xc.recv(&mut x, 0, 1)).unwrap_err(); // nobody sends
    assert!(t0.elapsed() >= Duration::from_millis(150));
    assert_eq!(e.status(), Status::Timeout);
    assert!(e.is_fatal());
    assert!(e.message().starts_with("braid_sync: timed out after 0.2 s"), "{}", e);
    let again = p.barrier().unwrap_err();
    assert!(again.message().starts_with("braid_barrier: communicator failed earlier"), "{}", again);
    c.barrier().unwrap();
}

#[test]
fn abort_from_another_thread() {
    let p = Arc::new(private(30.0));
    let done = Arc::new(AtomicBool::new(false));
    let t = {
        let (p, done) = (Arc::clone(&p), Arc::clone(&done));
        thread::spawn(move || {
            let mut x = [0u32; 2];
            let r = p.exchange(|xc| xc.recv(&mut x, 0, 3)); // blocks in sync until the abort
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    thread::sleep(Duration::from_millis(200));
    assert!(!done.load(Ordering::SeqCst));
    p.abort().unwrap();
    let e = t.join().unwrap().unwrap_err();
    assert_eq!(e.status(), Status::Aborted);
    assert_eq!(p.sync().unwrap_err().status(), Status::Aborted);
    comm().barrier().unwrap();
}

#[test]
fn abort_and_mismatch_reach_the_other_ranks() {
    let c = comm();
    if c.world_size() < 2 {
        return;
    }
    // abort on rank 0 of a child: the others' barrier fails with PeerLost naming it
    let sub = c.split_comm(Some(0), c.rank() as u32).unwrap().unwrap();
    if sub.rank() == 0 {
        sub.abort().unwrap();
        assert_eq!(sub.barrier().unwrap_err().status(), Status::Aborted);
    } else {
        let e = sub.barrier().unwrap_err();
        assert_eq!(e.status(), Status::PeerLost);
        assert!(e.message().contains("rank 0 aborted the communicator"), "{}", e);
    }
    drop(sub);
    c.barrier().unwrap();

    // different collectives on a child: MISMATCH on every rank, fatal
    let sub = c.split_comm(Some(0), c.rank() as u32).unwrap().unwrap();
    let mut x = vec![0f32; 16];
    let e = if sub.rank() == 0 {
        sub.broadcast_in_place(&mut x, 0).and_then(|_| sub.barrier()).unwrap_err()
    } else {
        sub.all_reduce_in_place(&mut x, Op::Sum).unwrap_err()
    };
    assert!(matches!(e.status(), Status::Mismatch | Status::PeerLost), "{}", e);
    assert!(e.is_fatal());
    drop(sub);
    c.barrier().unwrap();
}

#[test]
fn drop_with_pending_operations_returns() {
    // Drop contract: best-effort sync bounded by the destroy timeout, never a panic.
    let p = Comm::init_with(&Config::new().backend("self").rank(0).world_size(1).destroy_timeout(0.2)).unwrap();
    let mut x = vec![0u8; 16];
    unsafe { p.recv(x.as_mut_ptr() as u64, x.len(), DType::U8, 0, 9).unwrap() }; // never matched
    let t0 = Instant::now();
    drop(p);
    assert!(t0.elapsed() < Duration::from_secs(5));
    drop(x);
    comm().barrier().unwrap();
}

#[test]
fn init_errors() {
    let e = Comm::init_with(&Config::new().backend("nosuch")).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArg);
    assert!(e.message().starts_with("braid_init: unknown backend \"nosuch\""), "{}", e);
    let cfg = Config::new()
        .backend("shm")
        .rank(0)
        .world_size(2)
        .local(0, 1)
        .init_timeout(0.3)
        .store("127.0.0.1:1")
        .token(&"ab".repeat(32));
    let e = Comm::init_with(&cfg).unwrap_err();
    assert_eq!(e.status(), Status::Bootstrap);
    assert!(e.message().contains("could not reach the store at 127.0.0.1:1"), "{}", e);
    let e = Comm::init_with(&Config::new().backend("s\0hm")).unwrap_err();
    assert_eq!((e.status(), e.message()), (Status::InvalidArg, "braid_init: the backend contains a NUL byte"));
    comm().barrier().unwrap();
}

#[test]
fn mem_buffer_broadcast() {
    let c = comm();
    let mut m = MemBuffer::<u32>::zeroed(1 << 18).unwrap(); // 1 MiB
    assert!(m.iter().all(|&v| v == 0));
    if c.rank() == 0 {
        m.iter_mut().enumerate().for_each(|(i, v)| *v = i as u32 ^ 0x5a5a);
    }
    c.broadcast_in_place(&mut m, 0).unwrap();
    assert!(m.iter().enumerate().all(|(i, &v)| v == i as u32 ^ 0x5a5a));
    c.all_reduce_in_place(&mut m[..8], Op::BXor).unwrap();
    let want = if c.world_size() % 2 == 0 { 0 } else { 0x5a5a };
    assert_eq!(m[0], want);
    let v = braid::library_version();
    assert!(v.split('.').count() == 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()), "{}", v);
    c.barrier().unwrap();
}
