//! [`MemBuffer`]: a slice in braid memory (`braid_mem_alloc`).
use std::ops::{Deref, DerefMut};
use std::os::raw::c_void;
use std::ptr::{self, NonNull};

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
