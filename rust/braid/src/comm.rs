//! [`Comm`]: a braid communicator, its safe slice API, and its
//! implementation of the reference traits.
use std::ffi::{CStr, CString};
use std::io::Write;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};
use std::ptr::{self, NonNull};

use crate::communicator::{Communicator, ReduceOp, StreamSyncOps};
use crate::dtype::{DType, Element};
use crate::error::{check, Error, Result, Status};
use crate::ffi;
use crate::mem::{CommBuffer, Registrable, Registration};

/// Reductions of the safe API: the reference's four, plus braid's average and
/// bitwise operations. `Op::from(ReduceOp::Sum)` converts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Sum,
    Prod,
    Min,
    Max,
    /// Sum divided by the world size (integers: truncated toward zero).
    Avg,
    /// Bitwise and (integers, Bool).
    BAnd,
    /// Bitwise or (integers, Bool).
    BOr,
    /// Bitwise xor (integers, Bool).
    BXor,
}

impl Op {
    /// The `braid_op` code.
    pub const fn code(self) -> i32 {
        match self {
            Op::Sum => 0,
            Op::Prod => 1,
            Op::Min => 2,
            Op::Max => 3,
            Op::Avg => 4,
            Op::BAnd => 5,
            Op::BOr => 6,
            Op::BXor => 7,
        }
    }
}

impl From<ReduceOp> for Op {
    fn from(op: ReduceOp) -> Op {
        match op {
            ReduceOp::Sum => Op::Sum,
            ReduceOp::Prod => Op::Prod,
            ReduceOp::Min => Op::Min,
            ReduceOp::Max => Op::Max,
        }
    }
}

/// Settings for [`Comm::init_with`] (`braid_config`). A setting left unset
/// comes from its environment variable, then from the default.
#[derive(Debug, Clone, Default)]
pub struct Config {
    backend: Option<String>,
    rank: Option<usize>,
    world_size: Option<usize>,
    timeout_s: Option<f64>,
    destroy_timeout_s: Option<f64>,
    store: Option<String>,
    token: Option<String>,
    local: Option<(usize, usize)>,
    init_timeout_s: Option<f64>,
}

fn cstring(what: &str, s: &Option<String>) -> Result<Option<CString>> {
    match s {
        None => Ok(None),
        Some(v) => CString::new(v.as_str())
            .map(Some)
            .map_err(|_| Error::new(Status::InvalidArg, format!("braid_init: the {} contains a NUL byte", what))),
    }
}

impl Config {
    pub fn new() -> Config {
        Config::default()
    }
    /// "self", "shm", "tcp", ... (`BRAID_BACKEND`).
    pub fn backend(mut self, name: &str) -> Config {
        self.backend = Some(name.to_string());
        self
    }
    pub fn rank(mut self, rank: usize) -> Config {
        self.rank = Some(rank);
        self
    }
    /// World size; a world of 1 also makes this process the only one of its
    /// host (so a launcher's `BRAID_LOCAL_*` for a larger job do not apply).
    pub fn world_size(mut self, n: usize) -> Config {
        self.world_size = Some(n);
        self
    }
    /// Seconds a blocking call may wait without progress (0: forever).
    pub fn timeout(mut self, seconds: f64) -> Config {
        self.timeout_s = Some(seconds);
        self
    }
    /// Bound of the final sync in `drop` / `braid_destroy`.
    pub fn destroy_timeout(mut self, seconds: f64) -> Config {
        self.destroy_timeout_s = Some(seconds);
        self
    }
    /// "host:port" of the rendezvous store.
    pub fn store(mut self, addr: &str) -> Config {
        self.store = Some(addr.to_string());
        self
    }
    /// The job token, 64 hex digits.
    pub fn token(mut self, hex: &str) -> Config {
        self.token = Some(hex.to_string());
        self
    }
    pub fn local(mut self, local_rank: usize, local_size: usize) -> Config {
        self.local = Some((local_rank, local_size));
        self
    }
    /// Seconds the ranks may take to meet.
    pub fn init_timeout(mut self, seconds: f64) -> Config {
        self.init_timeout_s = Some(seconds);
        self
    }
}

/// A braid communicator.
///
/// `Comm::init()` creates one from the environment (braidrun's, torchrun's,
/// Slurm's or mpirun's variables; a lone process is a world of one). It
/// implements the reference [`Communicator`] and [`StreamSyncOps`] traits
/// (pointer-based, non-blocking as the reference defines them), and offers a
/// safe API on slices: collectives that complete before they return
/// (`all_reduce_in_place`, `broadcast_in_place`, `all_gather_into`,
/// `reduce_scatter_into`, ...) and [`Comm::exchange`] for send/recv.
///
/// `Comm` is `Send + Sync`: calls from several threads are serialized inside
/// braid. Dropping it runs `braid_destroy`: a best-effort sync bounded by
/// `BRAID_DESTROY_TIMEOUT` (default 5 s); a failure is logged, never a panic.
pub struct Comm {
    raw: NonNull<ffi::braid_comm>,
    rank: usize,
    size: usize,
    backend: String,
    stream: bool,
}

// braid serializes calls on one communicator; braid_abort is safe from any
// thread at any time.
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

fn usize_arg(call: &str, what: &str, v: usize, rank: usize) -> Result<c_int> {
    if v > c_int::MAX as usize {
        return Err(Error::new(
            Status::InvalidArg,
            format!("{}: {} {} is out of range (rank {})", call, what, v, rank),
        ));
    }
    Ok(v as c_int)
}

impl Comm {
    /// A communicator from the environment, like `braid_init(NULL, ...)`.
    pub fn init() -> Result<Comm> {
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::braid_init(ptr::null(), &mut raw) }, ptr::null())?;
        Ok(unsafe { Comm::from_raw(raw) })
    }

    /// A communicator with these settings (the rest from the environment).
    pub fn init_with(cfg: &Config) -> Result<Comm> {
        let backend = cstring("backend", &cfg.backend)?;
        let store = cstring("store address", &cfg.store)?;
        let token = cstring("token", &cfg.token)?;
        let mut c = ffi::braid_config::default();
        if let Some(b) = &backend {
            c.backend = b.as_ptr();
        }
        if let Some(s) = &store {
            c.store_addr = s.as_ptr();
        }
        if let Some(t) = &token {
            c.token_hex = t.as_ptr();
        }
        if let Some(r) = cfg.rank {
            c.rank = r.min(c_int::MAX as usize) as c_int;
        }
        if let Some(n) = cfg.world_size {
            c.world_size = n.min(c_int::MAX as usize) as c_int;
            if n == 1 && cfg.local.is_none() {
                c.local_rank = 0;
                c.local_size = 1;
            }
        }
        if let Some((r, n)) = cfg.local {
            c.local_rank = r.min(c_int::MAX as usize) as c_int;
            c.local_size = n.min(c_int::MAX as usize) as c_int;
        }
        if let Some(t) = cfg.timeout_s {
            c.timeout_s = t;
        }
        if let Some(t) = cfg.destroy_timeout_s {
            c.destroy_timeout_s = t;
        }
        if let Some(t) = cfg.init_timeout_s {
            c.init_timeout_s = t;
        }
        let mut raw = ptr::null_mut();
        check(unsafe { ffi::braid_init(&c, &mut raw) }, ptr::null())?;
        Ok(unsafe { Comm::from_raw(raw) })
    }

    /// Takes ownership of a `braid_comm` (destroyed on drop).
    ///
    /// # Safety
    ///
    /// `raw` must be a live communicator that nothing else destroys.
    pub unsafe fn from_raw(raw: *mut ffi::braid_comm) -> Comm {
        let raw = NonNull::new(raw).expect("Comm::from_raw: NULL communicator");
        let p = raw.as_ptr();
        let backend = CStr::from_ptr(ffi::braid_backend(p)).to_string_lossy().into_owned();
        Comm {
            raw,
            rank: ffi::braid_rank(p) as usize,
            size: ffi::braid_world_size(p) as usize,
            backend,
            stream: ffi::braid_has_stream_sync(p),
        }
    }

    /// The `braid_comm` (still owned by this `Comm`).
    pub fn as_raw(&self) -> *mut ffi::braid_comm {
        self.raw.as_ptr()
    }

    fn p(&self) -> *mut ffi::braid_comm {
        self.raw.as_ptr()
    }

    fn check(&self, code: ffi::braid_status) -> Result<()> {
        check(code, self.p())
    }

    /// This process's rank, 0 to `world_size() - 1`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.size
    }

    /// The backend's name: "self", "shm", "tcp", ...
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Whether the backend runs collectives on a CUDA communication stream.
    pub fn has_stream_sync(&self) -> bool {
        self.stream
    }

    /// Completes every pending operation of this rank.
    pub fn sync(&self) -> Result<()> {
        self.check(unsafe { ffi::braid_sync(self.p()) })
    }

    /// `sync`, then waits until every rank has reached the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.check(unsafe { ffi::braid_barrier(self.p()) })
    }

    /// Fails the communicator, from any thread at any time: a call blocked in
    /// it and every later call return `Status::Aborted`; the other ranks'
    /// calls fail with `Status::PeerLost` naming this rank.
    pub fn abort(&self) -> Result<()> {
        self.check(unsafe { ffi::braid_abort(self.p()) })
    }

    /// Collective: ranks with the same color form a new communicator, ranked
    /// by (key, old rank). `None` as color: this rank joins none (and gets
    /// `Ok(None)`).
    pub fn split_comm(&self, color: Option<u32>, key: u32) -> Result<Option<Comm>> {
        let mut out = ptr::null_mut();
        let c = color.unwrap_or(ffi::BRAID_SPLIT_NONE);
        self.check(unsafe { ffi::braid_split(self.p(), c, key, &mut out) })?;
        Ok(if out.is_null() { None } else { Some(unsafe { Comm::from_raw(out) }) })
    }

    // ------------------------------------------------------------ memory and registration

    /// `len` elements of `T` in communication memory that suits this
    /// communicator's backend (`braid_comm_mem_alloc`): device memory on
    /// nccl, `braid_mem_alloc`'s zero-filled host memory elsewhere (see
    /// [`CommBuffer`]). Freed with `braid_comm_mem_free` on drop.
    ///
    /// ```no_run
    /// # fn main() -> braid::Result<()> {
    /// let comm = braid::Comm::init()?;
    /// let mut grad = comm.mem_alloc::<f32>(1 << 20)?;
    /// if let Some(g) = grad.as_mut_slice() {
    ///     g.fill(1.0);
    ///     comm.all_reduce_in_place(g, braid::Op::Sum)?; // shm's peers read it in place
    /// }
    /// # Ok(()) }
    /// ```
    pub fn mem_alloc<T: Element>(&self, len: usize) -> Result<CommBuffer<'_, T>> {
        CommBuffer::alloc(self, len)
    }

    /// Registers `buf` (a slice, a `Vec`, a [`MemBuffer`](crate::MemBuffer)
    /// or a [`CommBuffer`]) with this communicator for its zero-copy paths
    /// (`braid_mem_register`: `ncclCommRegister` on nccl; elsewhere nothing to
    /// do, and the handle is a token). The [`Registration`] holds `buf`'s
    /// borrow, dereferences to it, and deregisters on drop. Optional:
    /// unregistered buffers work on every backend.
    ///
    /// ```no_run
    /// # fn main() -> braid::Result<()> {
    /// let comm = braid::Comm::init()?;
    /// let mut grad = vec![1.0f32; 1 << 20];
    /// let mut reg = comm.register(&mut grad)?;
    /// for _ in 0..10 {
    ///     comm.all_reduce_in_place(&mut reg, braid::Op::Sum)?;
    /// }
    /// reg.deregister()?;
    /// # Ok(()) }
    /// ```
    pub fn register<'b, B: Registrable + ?Sized>(&self, buf: &'b mut B) -> Result<Registration<'_, 'b, B>> {
        Registration::register(self, buf)
    }

    // ------------------------------------------------------------ safe slice API

    fn host_only(&self, call: &str) -> Result<()> {
        if self.stream {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "{}: backend {} runs on a device stream; the slice API takes host memory: use the Communicator \
                     trait's pointer methods (rank {})",
                    call, self.backend, self.rank
                ),
            ));
        }
        Ok(())
    }

    /// Reduces `buf` across ranks in place and waits for the result; every
    /// rank gets bitwise-identical values.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: Op) -> Result<()> {
        self.host_only("braid_all_reduce")?;
        self.check(unsafe {
            ffi::braid_all_reduce(self.p(), buf.as_mut_ptr() as *mut c_void, buf.len(), T::DTYPE.code(), op.code())
        })?;
        self.sync()
    }

    /// Copies root's `buf` into every rank's `buf`.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.host_only("braid_broadcast")?;
        let r = usize_arg("braid_broadcast", "root", root, self.rank)?;
        self.check(unsafe {
            ffi::braid_broadcast(self.p(), buf.as_mut_ptr() as *mut c_void, buf.len(), T::DTYPE.code(), r)
        })?;
        self.sync()
    }

    /// Rank r's `send` lands at `recv[r * send.len()..]`; `recv` must hold
    /// `send.len() * world_size()` elements.
    pub fn all_gather_into<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        self.host_only("braid_all_gather")?;
        if Some(recv.len()) != send.len().checked_mul(self.size) {
            return Err(Error::new(
                Status::InvalidArg,
                format!(
                    "braid_all_gather: recv holds {} elements of {} but must hold {} ({} ranks x {}) (rank {})",
                    recv.len(),
                    T::DTYPE,
                    send.len().saturating_mul(self.size),
                    self.size,
                    send.len(),
                    self.rank
                ),
            ));
        }
        self.check(unsafe {
            ffi::braid_all_gather(
                self.p(),
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                send.len(),
                T::DTYPE.code(),
            )
        })?;
        self.sync()
    }

    /// All-gather in place: `buf` holds `world_size()` blocks, and this rank's
    /// block (block `rank()`) is what it contributes.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.host_only("braid_all_gather")?;
        let n = self.block_of("braid_all_gather", buf.len())?;
        let base = buf.as_mut_ptr();
        self.check(unsafe {
            ffi::braid_all_gather(
                self.p(),
                base.add(self.rank * n) as *const c_void,
                base as *mut c_void,
                n,
                T::DTYPE.code(),
            )
        })?;
        self.sync()
    }

    /// `send` holds `world_size()` blocks of `recv.len()` elements; this rank
    /// receives the reduction of every rank's block `rank()`.
    pub fn reduce_scatter_into<T: Element>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<()> {
        self.host_only("braid_reduce_scatter")?;
        if Some(send.len()) != recv.len().checked_mul(self.size) {
            return Err(Error::new(
                Status::InvalidArg,
                format!(
                    "braid_reduce_scatter: send holds {} elements of {} but must hold {} ({} ranks x {}) (rank {})",
                    send.len(),
                    T::DTYPE,
                    recv.len().saturating_mul(self.size),
                    self.size,
                    recv.len(),
                    self.rank
                ),
            ));
        }
        self.check(unsafe {
            ffi::braid_reduce_scatter(
                self.p(),
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                recv.len(),
                T::DTYPE.code(),
                op.code(),
            )
        })?;
        self.sync()
    }

    /// Reduce-scatter in place: the result lands in block `rank()` of `buf`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: Op) -> Result<()> {
        self.host_only("braid_reduce_scatter")?;
        let n = self.block_of("braid_reduce_scatter", buf.len())?;
        let base = buf.as_mut_ptr();
        self.check(unsafe {
            ffi::braid_reduce_scatter(
                self.p(),
                base as *const c_void,
                base.add(self.rank * n) as *mut c_void,
                n,
                T::DTYPE.code(),
                op.code(),
            )
        })?;
        self.sync()
    }

    fn root_arg(&self, call: &str, root: usize) -> Result<c_int> {
        if root >= self.size {
            return Err(Error::new(
                Status::InvalidArg,
                format!("{}: root {} out of range for world size {} (rank {})", call, root, self.size, self.rank),
            ));
        }
        usize_arg(call, "root", root, self.rank)
    }

    fn at_root<B>(&self, call: &str, what: &str, root: usize, buf: Option<B>) -> Result<Option<B>> {
        match buf {
            None if self.rank == root => Err(Error::new(
                Status::InvalidArg,
                format!("{}: {} is None at the root (rank {})", call, what, self.rank),
            )),
            b if self.rank == root => Ok(b),
            _ => Ok(None), // used at the root only
        }
    }

    fn sized(&self, call: &str, what: &str, dt: DType, len: usize, want: usize, per: usize) -> Result<()> {
        if len == want {
            return Ok(());
        }
        Err(Error::new(
            Status::InvalidArg,
            format!(
                "{}: {} holds {} elements of {} but must hold {} ({} ranks x {}) (rank {})",
                call, what, len, dt, want, self.size, per, self.rank
            ),
        ))
    }

    /// Reduces every rank's `send` into the root's `recv` (`send.len()`
    /// elements) and waits. `recv` is used at the root only: other ranks pass
    /// `None`. For the root's result in place, use [`Comm::reduce_in_place`].
    pub fn reduce_into<T: Element>(&self, send: &[T], recv: Option<&mut [T]>, op: Op, root: usize) -> Result<()> {
        const CALL: &str = "braid_reduce";
        self.host_only(CALL)?;
        let r = self.root_arg(CALL, root)?;
        let recv = self.at_root(CALL, "recv", root, recv)?;
        let rp = match recv {
            Some(b) if b.len() != send.len() => {
                return Err(Error::new(
                    Status::InvalidArg,
                    format!(
                        "{}: recv holds {} elements of {} but must hold {}, as send does (rank {})",
                        CALL,
                        b.len(),
                        T::DTYPE,
                        send.len(),
                        self.rank
                    ),
                ))
            }
            Some(b) => b.as_mut_ptr() as *mut c_void,
            None => ptr::null_mut(),
        };
        self.check(unsafe {
            ffi::braid_reduce(self.p(), send.as_ptr() as *const c_void, rp, send.len(), T::DTYPE.code(), op.code(), r)
        })?;
        self.sync()
    }

    /// Reduce with the root's result in its own `buf`; other ranks' `buf`
    /// is only read.
    pub fn reduce_in_place<T: Element>(&self, buf: &mut [T], op: Op, root: usize) -> Result<()> {
        const CALL: &str = "braid_reduce";
        self.host_only(CALL)?;
        let r = self.root_arg(CALL, root)?;
        let p = buf.as_mut_ptr() as *mut c_void;
        let rp = if self.rank == root { p } else { ptr::null_mut() };
        self.check(unsafe { ffi::braid_reduce(self.p(), p as *const c_void, rp, buf.len(), T::DTYPE.code(), op.code(), r) })?;
        self.sync()
    }

    /// Rank r's `send` lands at `recv[r * send.len()..]` of the root, whose
    /// `recv` holds `send.len() * world_size()` elements; other ranks pass
    /// `None`.
    pub fn gather_into<T: Element>(&self, send: &[T], recv: Option<&mut [T]>, root: usize) -> Result<()> {
        const CALL: &str = "braid_gather";
        self.host_only(CALL)?;
        let r = self.root_arg(CALL, root)?;
        let rp = match self.at_root(CALL, "recv", root, recv)? {
            Some(b) => {
                self.sized(CALL, "recv", T::DTYPE, b.len(), send.len().saturating_mul(self.size), send.len())?;
                b.as_mut_ptr() as *mut c_void
            }
            None => ptr::null_mut(),
        };
        self.check(unsafe {
            ffi::braid_gather(self.p(), send.as_ptr() as *const c_void, rp, send.len(), T::DTYPE.code(), r)
        })?;
        self.sync()
    }

    /// Rank r receives `send[r * recv.len()..]` of the root, whose `send`
    /// holds `recv.len() * world_size()` elements; other ranks pass `None`.
    pub fn scatter_into<T: Element>(&self, send: Option<&[T]>, recv: &mut [T], root: usize) -> Result<()> {
        const CALL: &str = "braid_scatter";
        self.host_only(CALL)?;
        let r = self.root_arg(CALL, root)?;
        let sp = match self.at_root(CALL, "send", root, send)? {
            Some(b) => {
                self.sized(CALL, "send", T::DTYPE, b.len(), recv.len().saturating_mul(self.size), recv.len())?;
                b.as_ptr() as *const c_void
            }
            None => ptr::null(),
        };
        self.check(unsafe {
            ffi::braid_scatter(self.p(), sp, recv.as_mut_ptr() as *mut c_void, recv.len(), T::DTYPE.code(), r)
        })?;
        self.sync()
    }

    /// `send` and `recv` hold `world_size()` blocks of one size: block j of
    /// rank i lands as block i of rank j.
    pub fn all_to_all_into<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        const CALL: &str = "braid_all_to_all";
        self.host_only(CALL)?;
        let n = self.block_of(CALL, send.len())?;
        self.sized(CALL, "recv", T::DTYPE, recv.len(), send.len(), n)?;
        self.check(unsafe {
            ffi::braid_all_to_all(
                self.p(),
                send.as_ptr() as *const c_void,
                recv.as_mut_ptr() as *mut c_void,
                n,
                T::DTYPE.code(),
            )
        })?;
        self.sync()
    }

    /// All-to-all in place: block j of `buf` goes to rank j, and block i
    /// comes from rank i.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        const CALL: &str = "braid_all_to_all";
        self.host_only(CALL)?;
        let n = self.block_of(CALL, buf.len())?;
        let p = buf.as_mut_ptr() as *mut c_void;
        self.check(unsafe { ffi::braid_all_to_all(self.p(), p as *const c_void, p, n, T::DTYPE.code()) })?;
        self.sync()
    }

    fn block_of(&self, call: &str, len: usize) -> Result<usize> {
        if len % self.size != 0 {
            return Err(Error::new(
                Status::InvalidArg,
                format!("{}: {} elements are not {} equal blocks (rank {})", call, len, self.size, self.rank),
            ));
        }
        Ok(len / self.size)
    }

    /// Sends and receives, then waits for all of them: the closure posts
    /// operations through an [`Exchange`], whose buffers stay borrowed until
    /// they are complete. A symmetric exchange (every rank sends to and
    /// receives from its neighbours) never deadlocks.
    ///
    /// When the closure returns (an error included) or panics, `exchange`
    /// completes what was posted (`sync`); if that fails, the communicator is
    /// aborted, so nothing writes into the buffers after they are released.
    ///
    /// ```no_run
    /// # fn main() -> braid::Result<()> {
    /// let comm = braid::Comm::init()?;
    /// let (r, n) = (comm.rank(), comm.world_size());
    /// let out = vec![r as f32; 8];
    /// let mut got = vec![0f32; 8];
    /// comm.exchange(|x| {
    ///     x.send(&out, (r + 1) % n, 0)?;
    ///     x.recv(&mut got, (r + n - 1) % n, 0)
    /// })?;
    /// assert!(got.iter().all(|&v| v == ((r + n - 1) % n) as f32));
    /// # Ok(()) }
    /// ```
    pub fn exchange<'b, R, F>(&self, f: F) -> Result<R>
    where
        F: for<'c> FnOnce(&Exchange<'c, 'b>) -> Result<R>,
    {
        self.host_only("braid_send")?;
        struct Guard<'a> {
            comm: &'a Comm,
            armed: bool,
        }
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                if self.armed && self.comm.sync().is_err() {
                    let _ = self.comm.abort();
                }
            }
        }
        let mut guard = Guard { comm: self, armed: true };
        let x = Exchange { comm: self, _bufs: PhantomData };
        let r = f(&x);
        guard.armed = false;
        let s = self.sync();
        if s.is_err() {
            let _ = self.abort();
        }
        let v = r?;
        s?;
        Ok(v)
    }
}

/// Posts sends and receives inside [`Comm::exchange`]. Buffers must outlive
/// the whole `exchange` call (`'b`), which completes them before returning.
pub struct Exchange<'c, 'b> {
    comm: &'c Comm,
    // invariant in 'b: a buffer that lives shorter than the exchange is refused
    _bufs: PhantomData<fn(&'b ()) -> &'b ()>,
}

impl<'c, 'b> Exchange<'c, 'b> {
    /// Posts a send of `buf` to rank `dest` with `tag`.
    pub fn send<T: Element>(&self, buf: &'b [T], dest: usize, tag: u32) -> Result<()> {
        let c = self.comm;
        let d = usize_arg("braid_send", "dest", dest, c.rank)?;
        c.check(unsafe { ffi::braid_send(c.p(), buf.as_ptr() as *const c_void, buf.len(), T::DTYPE.code(), d, tag) })
    }

    /// Posts a receive into `buf` from rank `src` with `tag`. A message of
    /// another size or type fails with `Status::Mismatch` naming both sizes
    /// (from here or from the exchange's final sync); the message stays for a
    /// receive of the right shape.
    pub fn recv<T: Element>(&self, buf: &'b mut [T], src: usize, tag: u32) -> Result<()> {
        let c = self.comm;
        let s = usize_arg("braid_recv", "src", src, c.rank)?;
        c.check(unsafe { ffi::braid_recv(c.p(), buf.as_mut_ptr() as *mut c_void, buf.len(), T::DTYPE.code(), s, tag) })
    }

    /// The communicator.
    pub fn comm(&self) -> &Comm {
        self.comm
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        let st = unsafe { ffi::braid_destroy(self.p()) };
        if st != ffi::BRAID_OK {
            let e = Error::last(st, ptr::null());
            let _ = writeln!(std::io::stderr(), "braid: dropping the communicator (rank {}): {}", self.rank, e);
        }
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.rank)
            .field("world_size", &self.size)
            .field("backend", &self.backend)
            .finish()
    }
}

// ---------------------------------------------------------------- the reference traits

fn rank_arg(c: &Comm, call: &str, what: &str, v: usize) -> Result<c_int> {
    usize_arg(call, what, v, c.rank)
}

impl Communicator for Comm {
    fn world_size(&self) -> usize {
        self.size
    }

    fn rank(&self) -> usize {
        self.rank
    }

    unsafe fn all_reduce(&self, ptr: u64, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        self.check(ffi::braid_all_reduce(
            self.p(),
            ptr as usize as *mut c_void,
            count,
            dtype.code(),
            Op::from(op).code(),
        ))
    }

    unsafe fn broadcast(&self, ptr: u64, count: usize, dtype: DType, root: usize) -> Result<()> {
        let r = rank_arg(self, "braid_broadcast", "root", root)?;
        self.check(ffi::braid_broadcast(self.p(), ptr as usize as *mut c_void, count, dtype.code(), r))
    }

    unsafe fn all_gather(&self, send_ptr: u64, recv_ptr: u64, count: usize, dtype: DType) -> Result<()> {
        self.check(ffi::braid_all_gather(
            self.p(),
            send_ptr as usize as *const c_void,
            recv_ptr as usize as *mut c_void,
            count,
            dtype.code(),
        ))
    }

    unsafe fn reduce_scatter(
        &self,
        send_ptr: u64,
        recv_ptr: u64,
        count: usize,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.check(ffi::braid_reduce_scatter(
            self.p(),
            send_ptr as usize as *const c_void,
            recv_ptr as usize as *mut c_void,
            count,
            dtype.code(),
            Op::from(op).code(),
        ))
    }

    unsafe fn send(&self, ptr: u64, count: usize, dtype: DType, dest: usize, tag: u32) -> Result<()> {
        let d = rank_arg(self, "braid_send", "dest", dest)?;
        self.check(ffi::braid_send(self.p(), ptr as usize as *const c_void, count, dtype.code(), d, tag))
    }

    unsafe fn recv(&self, ptr: u64, count: usize, dtype: DType, src: usize, tag: u32) -> Result<()> {
        let s = rank_arg(self, "braid_recv", "src", src)?;
        self.check(ffi::braid_recv(self.p(), ptr as usize as *mut c_void, count, dtype.code(), s, tag))
    }

    fn sync(&self) -> Result<()> {
        Comm::sync(self)
    }

    fn barrier(&self) -> Result<()> {
        Comm::barrier(self)
    }

    /// braid splits on every backend: `Ok(None)` only for a rank that passed
    /// `BRAID_SPLIT_NONE` (`u32::MAX`) as its color.
    fn split(&self, color: u32, key: u32) -> Result<Option<Box<dyn Communicator>>> {
        let c = if color == ffi::BRAID_SPLIT_NONE { None } else { Some(color) };
        Ok(self.split_comm(c, key)?.map(|c| Box::new(c) as Box<dyn Communicator>))
    }

    fn as_stream_sync(&self) -> Option<&dyn StreamSyncOps> {
        if self.stream {
            Some(self)
        } else {
            None
        }
    }
}

/// The CUDA stream/event hooks. On a backend without a communication stream
/// (`as_stream_sync()` is `None`) every method fails with
/// `Status::Unsupported` naming the backend.
///
/// The reference trait takes raw handles in safe methods, so braid checks
/// every event handle before CUDA sees it: one that `create_event` did not
/// make, or that was destroyed, fails with `Status::InvalidArg`. A stream
/// handle cannot be checked: it must be a live `cudaStream_t` of the
/// communicator's device, or 0 for the default stream.
impl StreamSyncOps for Comm {
    fn create_event(&self) -> Result<u64> {
        let mut ev = 0u64;
        self.check(unsafe { ffi::braid_event_create(self.p(), &mut ev) })?;
        Ok(ev)
    }

    fn destroy_event(&self, event: u64) -> Result<()> {
        self.check(unsafe { ffi::braid_event_destroy(self.p(), event) })
    }

    fn record_on_comm_stream(&self, event: u64) -> Result<()> {
        self.check(unsafe { ffi::braid_event_record_on_comm_stream(self.p(), event) })
    }

    fn record_on_stream(&self, event: u64, stream_handle: u64) -> Result<()> {
        self.check(unsafe { ffi::braid_event_record_on_stream(self.p(), event, stream_handle) })
    }

    fn comm_stream_wait_event(&self, event: u64) -> Result<()> {
        self.check(unsafe { ffi::braid_comm_stream_wait_event(self.p(), event) })
    }

    fn stream_wait_event(&self, stream_handle: u64, event: u64) -> Result<()> {
        self.check(unsafe { ffi::braid_stream_wait_event(self.p(), stream_handle, event) })
    }

    fn sync_comm_stream(&self) -> Result<()> {
        self.check(unsafe { ffi::braid_sync_comm_stream(self.p()) })
    }
}
