//! Memory for communication: [`MemBuffer`], a slice in braid memory
//! (`braid_mem_alloc`); [`CommBuffer`], memory that suits a communicator's
//! backend (`braid_comm_mem_alloc`, from [`Comm::mem_alloc`]); and
//! [`Registration`], a buffer registered with a communicator
//! (`braid_mem_register`, from [`Comm::register`]).
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

use crate::comm::Comm;
use crate::dtype::Element;
use crate::error::{check, Result};
use crate::ffi;

/// `len` zero-filled elements of `T` in braid memory: memory every backend
/// takes, and that the shm backend's peers read in place instead of through
/// staging (like NCCL's `ncclMemAlloc`). Dereferences to `[T]`; freed with
/// `braid_mem_free` on drop. Not tied to a communicator.
pub struct MemBuffer<T: Element> {
    ptr: NonNull<T>,
    len: usize,
}

unsafe impl<T: Element> Send for MemBuffer<T> {}
unsafe impl<T: Element> Sync for MemBuffer<T> {}

impl<T: Element> MemBuffer<T> {
    /// Allocates `len` zeroed elements (at least one page).
    pub fn zeroed(len: usize) -> Result<MemBuffer<T>> {
        let bytes = len.saturating_mul(std::mem::size_of::<T>()).max(1);
        let mut p: *mut c_void = ptr::null_mut();
        check(unsafe { ffi::braid_mem_alloc(&mut p, bytes) }, ptr::null())?;
        // page-aligned, so aligned for every T
        Ok(MemBuffer { ptr: NonNull::new(p as *mut T).expect("braid_mem_alloc returned NULL"), len })
    }
}

impl<T: Element> Deref for MemBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // zero-filled memory is a valid T (Element: every bit pattern is valid)
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> DerefMut for MemBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Element> Drop for MemBuffer<T> {
    fn drop(&mut self) {
        unsafe {
            ffi::braid_mem_free(self.ptr.as_ptr() as *mut c_void);
        }
    }
}

/// Communication memory that suits a communicator's backend
/// (`braid_comm_mem_alloc`), from [`Comm::mem_alloc`]: `len` elements of `T`.
///
/// - On `nccl` it is device memory (`ncclMemAlloc`, on the current CUDA
///   device; not zero-filled), which the host cannot address:
///   [`as_slice`](CommBuffer::as_slice) is `None`, and [`addr`](CommBuffer::addr)
///   is the pointer for the [`Communicator`](crate::Communicator) trait's
///   methods.
/// - On every other backend it is `braid_mem_alloc`'s host memory,
///   zero-filled, which the shm backend's peers read in place:
///   `as_slice` / `as_mut_slice` give it to the slice API.
///
/// It borrows the communicator, so it cannot outlive it:
///
/// ```compile_fail
/// let m = {
///     let c = braid::Comm::init().unwrap();
///     c.mem_alloc::<f32>(16).unwrap() // error: `c` does not live long enough
/// };
/// ```
///
/// Dropping it frees it with `braid_comm_mem_free`; [`free`](CommBuffer::free)
/// does the same and reports braid's error. On a failed communicator that
/// call fails, yet host memory is still freed (through `braid_mem_free`,
/// which is what `braid_comm_mem_free` does on those backends).
pub struct CommBuffer<'c, T: Element> {
    comm: &'c Comm,
    ptr: NonNull<T>,
    len: usize,
    device: bool,
}

unsafe impl<T: Element> Send for CommBuffer<'_, T> {}
unsafe impl<T: Element> Sync for CommBuffer<'_, T> {}

impl<'c, T: Element> CommBuffer<'c, T> {
    pub(crate) fn alloc(comm: &'c Comm, len: usize) -> Result<CommBuffer<'c, T>> {
        // braid refuses a size beyond the address space, and 0
        let bytes = len.saturating_mul(std::mem::size_of::<T>()).max(1);
        let mut p: *mut c_void = ptr::null_mut();
        check(unsafe { ffi::braid_comm_mem_alloc(comm.as_raw(), &mut p, bytes) }, comm.as_raw())?;
        // page-aligned (braid_mem_alloc) or aligned to the device's granularity (ncclMemAlloc)
        let ptr = NonNull::new(p as *mut T).expect("braid_comm_mem_alloc returned NULL");
        Ok(CommBuffer { comm, ptr, len, device: comm.backend() == "nccl" })
    }

    /// Takes ownership of memory that `braid_comm_mem_alloc` gave on `comm`'s
    /// backend (freed on drop, or by [`free`](CommBuffer::free)).
    ///
    /// # Safety
    ///
    /// `ptr` must hold `len` elements of `T` from `braid_comm_mem_alloc` on a
    /// communicator of the same backend as `comm`, and nothing else may free
    /// it. Host memory must be initialized (braid's is zero-filled).
    pub unsafe fn from_raw(comm: &'c Comm, ptr: *mut T, len: usize) -> CommBuffer<'c, T> {
        let ptr = NonNull::new(ptr).expect("CommBuffer::from_raw: NULL pointer");
        CommBuffer { comm, ptr, len, device: comm.backend() == "nccl" }
    }

    /// Gives up ownership: the memory stays allocated until
    /// `braid_comm_mem_free` (or [`from_raw`](CommBuffer::from_raw) and a drop).
    pub fn into_raw(self) -> *mut T {
        ManuallyDrop::new(self).ptr.as_ptr()
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it is device memory (backend nccl), which the host cannot address.
    pub fn is_device(&self) -> bool {
        self.device
    }

    /// The communicator it came from.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    pub fn as_ptr(&self) -> *const T {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// The address, as the [`Communicator`](crate::Communicator) trait's
    /// methods take it (device memory included).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    /// The elements, for host memory; `None` for device memory.
    pub fn as_slice(&self) -> Option<&[T]> {
        if self.device {
            return None;
        }
        // zero-filled (or initialized, from_raw) memory is a valid T: every bit pattern is
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The elements, for host memory; `None` for device memory.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        if self.device {
            return None;
        }
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Frees it (`braid_comm_mem_free`) and reports braid's error.
    pub fn free(self) -> Result<()> {
        ManuallyDrop::new(self).release()
    }

    fn release(&self) -> Result<()> {
        let c = self.comm.as_raw();
        let p = self.ptr.as_ptr() as *mut c_void;
        let r = check(unsafe { ffi::braid_comm_mem_free(c, p) }, c);
        if r.is_err() && !self.device {
            // a failed communicator refuses every call; the memory is braid_mem_alloc's
            unsafe { ffi::braid_mem_free(p) };
        }
        r
    }
}

impl<T: Element> Drop for CommBuffer<'_, T> {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl<T: Element> std::fmt::Debug for CommBuffer<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("dtype", &T::DTYPE)
            .field("device", &self.device)
            .finish()
    }
}

/// Memory that [`Comm::register`] can register: a region of bytes.
///
/// # Safety
///
/// `region` must return the address and length in bytes of memory that this
/// value owns or borrows, valid for as long as the value is mutably borrowed.
pub unsafe trait Registrable {
    /// The address and length in bytes.
    fn region(&mut self) -> (*mut c_void, usize);
}

unsafe impl<T: Element> Registrable for [T] {
    fn region(&mut self) -> (*mut c_void, usize) {
        (self.as_mut_ptr() as *mut c_void, std::mem::size_of_val(self))
    }
}

unsafe impl<T: Element> Registrable for Vec<T> {
    fn region(&mut self) -> (*mut c_void, usize) {
        self.as_mut_slice().region()
    }
}

unsafe impl<T: Element> Registrable for MemBuffer<T> {
    fn region(&mut self) -> (*mut c_void, usize) {
        (self.ptr.as_ptr() as *mut c_void, self.len * std::mem::size_of::<T>())
    }
}

unsafe impl<T: Element> Registrable for CommBuffer<'_, T> {
    fn region(&mut self) -> (*mut c_void, usize) {
        (self.ptr.as_ptr() as *mut c_void, self.len * std::mem::size_of::<T>())
    }
}

/// A buffer registered with a communicator for its zero-copy paths
/// (`braid_mem_register`: `ncclCommRegister` on nccl; on the other backends
/// there is nothing to register and the handle is a token), from
/// [`Comm::register`].
///
/// It holds the buffer's mutable borrow and dereferences to it, so the
/// registered buffer is used through the registration
/// (`comm.all_reduce_in_place(&mut reg, Op::Sum)`) and cannot be moved or
/// freed while registered. Dropping it deregisters it
/// (`braid_mem_deregister`); [`deregister`](Registration::deregister) does the
/// same and reports braid's error. Deregistering consumes it, so a
/// registration cannot be deregistered twice:
///
/// ```compile_fail
/// let c = braid::Comm::init().unwrap();
/// let mut v = vec![0f32; 16];
/// let reg = c.register(&mut v).unwrap();
/// reg.deregister().unwrap();
/// reg.deregister().unwrap(); // error: use of moved value: `reg`
/// ```
pub struct Registration<'c, 'b, B: Registrable + ?Sized> {
    comm: &'c Comm,
    handle: *mut c_void,
    buf: &'b mut B,
}

unsafe impl<B: Registrable + Send + ?Sized> Send for Registration<'_, '_, B> {}
unsafe impl<B: Registrable + Sync + ?Sized> Sync for Registration<'_, '_, B> {}

impl<'c, 'b, B: Registrable + ?Sized> Registration<'c, 'b, B> {
    pub(crate) fn register(comm: &'c Comm, buf: &'b mut B) -> Result<Registration<'c, 'b, B>> {
        let (p, bytes) = buf.region();
        let mut handle: *mut c_void = ptr::null_mut();
        check(unsafe { ffi::braid_mem_register(comm.as_raw(), p, bytes, &mut handle) }, comm.as_raw())?;
        Ok(Registration { comm, handle, buf })
    }

    /// Takes ownership of a registration of `buf` that `braid_mem_register`
    /// gave on `comm` (deregistered on drop, or by
    /// [`deregister`](Registration::deregister)).
    ///
    /// # Safety
    ///
    /// `handle` must come from `braid_mem_register(comm, ...)` for `buf`'s
    /// memory, and nothing else may deregister it.
    pub unsafe fn from_raw(comm: &'c Comm, handle: *mut c_void, buf: &'b mut B) -> Registration<'c, 'b, B> {
        Registration { comm, handle, buf }
    }

    /// Gives up ownership: the buffer stays registered until
    /// `braid_mem_deregister(comm, handle)`; returns the handle and the buffer.
    pub fn into_raw(self) -> (*mut c_void, &'b mut B) {
        let me = ManuallyDrop::new(self);
        // moved out of a value that is never dropped
        (me.handle, unsafe { ptr::read(&me.buf) })
    }

    /// braid's handle (on backends without registration, a token).
    pub fn handle(&self) -> *mut c_void {
        self.handle
    }

    /// The communicator it is registered with.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// Ends the registration (`braid_mem_deregister`) and reports braid's
    /// error; the buffer's borrow ends with it.
    pub fn deregister(self) -> Result<()> {
        ManuallyDrop::new(self).release()
    }

    fn release(&self) -> Result<()> {
        let c = self.comm.as_raw();
        check(unsafe { ffi::braid_mem_deregister(c, self.handle) }, c)
    }
}

impl<B: Registrable + ?Sized> Deref for Registration<'_, '_, B> {
    type Target = B;
    fn deref(&self) -> &B {
        self.buf
    }
}

impl<B: Registrable + ?Sized> DerefMut for Registration<'_, '_, B> {
    fn deref_mut(&mut self) -> &mut B {
        self.buf
    }
}

impl<B: Registrable + ?Sized> Drop for Registration<'_, '_, B> {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl<B: Registrable + ?Sized> std::fmt::Debug for Registration<'_, '_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("handle", &self.handle).finish()
    }
}
