//! The C API of `include/braid.h`, declared as it is. Everything here is
//! `unsafe`; the rest of the crate wraps it.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

/// Opaque `braid_comm`.
#[repr(C)]
pub struct braid_comm {
    _private: [u8; 0],
}

/// `braid_status`: 0 is `BRAID_OK`.
pub type braid_status = c_int;
/// `braid_dtype`: the reference DType codes.
pub type braid_dtype = c_int;
/// `braid_op`.
pub type braid_op = c_int;

pub const BRAID_OK: braid_status = 0;
/// Color of `braid_split` for a rank that joins no new communicator.
pub const BRAID_SPLIT_NONE: u32 = u32::MAX;

/// `struct braid_config`. Start from [`braid_config::default`]
/// (`BRAID_CONFIG_INIT`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct braid_config {
    pub struct_size: usize,
    pub backend: *const c_char,
    pub rank: c_int,
    pub world_size: c_int,
    pub timeout_s: f64,
    pub destroy_timeout_s: f64,
    pub store_addr: *const c_char,
    pub token_hex: *const c_char,
    pub local_rank: c_int,
    pub local_size: c_int,
    pub init_timeout_s: f64,
}

impl Default for braid_config {
    /// `BRAID_CONFIG_INIT`: every field from the environment, then the default.
    fn default() -> Self {
        braid_config {
            struct_size: std::mem::size_of::<braid_config>(),
            backend: std::ptr::null(),
            rank: -1,
            world_size: -1,
            timeout_s: -1.0,
            destroy_timeout_s: -1.0,
            store_addr: std::ptr::null(),
            token_hex: std::ptr::null(),
            local_rank: -1,
            local_size: -1,
            init_timeout_s: -1.0,
        }
    }
}

extern "C" {
    pub fn braid_version() -> *const c_char;
    pub fn braid_dtype_size(dtype: braid_dtype) -> usize;
    pub fn braid_dtype_name(dtype: braid_dtype) -> *const c_char;
    pub fn braid_op_name(op: braid_op) -> *const c_char;
    pub fn braid_status_string(st: braid_status) -> *const c_char;
    pub fn braid_last_error(comm: *const braid_comm) -> *const c_char;

    pub fn braid_init(cfg: *const braid_config, comm: *mut *mut braid_comm) -> braid_status;
    pub fn braid_destroy(comm: *mut braid_comm) -> braid_status;
    pub fn braid_abort(comm: *mut braid_comm) -> braid_status;
    pub fn braid_world_size(comm: *const braid_comm) -> c_int;
    pub fn braid_rank(comm: *const braid_comm) -> c_int;
    pub fn braid_backend(comm: *const braid_comm) -> *const c_char;

    pub fn braid_all_reduce(
        c: *mut braid_comm,
        buf: *mut c_void,
        count: usize,
        dt: braid_dtype,
        op: braid_op,
    ) -> braid_status;
    pub fn braid_broadcast(
        c: *mut braid_comm,
        buf: *mut c_void,
        count: usize,
        dt: braid_dtype,
        root: c_int,
    ) -> braid_status;
    pub fn braid_all_gather(
        c: *mut braid_comm,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: braid_dtype,
    ) -> braid_status;
    pub fn braid_reduce_scatter(
        c: *mut braid_comm,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: braid_dtype,
        op: braid_op,
    ) -> braid_status;
    pub fn braid_reduce(
        c: *mut braid_comm,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: braid_dtype,
        op: braid_op,
        root: c_int,
    ) -> braid_status;
    pub fn braid_gather(
        c: *mut braid_comm,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: braid_dtype,
        root: c_int,
    ) -> braid_status;
    pub fn braid_scatter(
        c: *mut braid_comm,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: braid_dtype,
        root: c_int,
    ) -> braid_status;
    pub fn braid_all_to_all(
        c: *mut braid_comm,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: braid_dtype,
    ) -> braid_status;
    pub fn braid_send(
        c: *mut braid_comm,
        buf: *const c_void,
        count: usize,
        dt: braid_dtype,
        dest: c_int,
        tag: u32,
    ) -> braid_status;
    pub fn braid_recv(
        c: *mut braid_comm,
        buf: *mut c_void,
        count: usize,
        dt: braid_dtype,
        src: c_int,
        tag: u32,
    ) -> braid_status;
    pub fn braid_sync(c: *mut braid_comm) -> braid_status;
    pub fn braid_barrier(c: *mut braid_comm) -> braid_status;
    pub fn braid_split(c: *mut braid_comm, color: u32, key: u32, out: *mut *mut braid_comm) -> braid_status;

    pub fn braid_mem_alloc(ptr: *mut *mut c_void, size: usize) -> braid_status;
    pub fn braid_mem_free(ptr: *mut c_void) -> braid_status;
    pub fn braid_comm_mem_alloc(c: *mut braid_comm, ptr: *mut *mut c_void, size: usize) -> braid_status;
    pub fn braid_comm_mem_free(c: *mut braid_comm, ptr: *mut c_void) -> braid_status;
    pub fn braid_mem_register(
        c: *mut braid_comm,
        buf: *mut c_void,
        size: usize,
        handle: *mut *mut c_void,
    ) -> braid_status;
    pub fn braid_mem_deregister(c: *mut braid_comm, handle: *mut c_void) -> braid_status;

    pub fn braid_has_stream_sync(c: *const braid_comm) -> bool;
    pub fn braid_event_create(c: *mut braid_comm, event: *mut u64) -> braid_status;
    pub fn braid_event_destroy(c: *mut braid_comm, event: u64) -> braid_status;
    pub fn braid_event_record_on_comm_stream(c: *mut braid_comm, event: u64) -> braid_status;
    pub fn braid_event_record_on_stream(c: *mut braid_comm, event: u64, stream: u64) -> braid_status;
    pub fn braid_comm_stream_wait_event(c: *mut braid_comm, event: u64) -> braid_status;
    pub fn braid_stream_wait_event(c: *mut braid_comm, stream: u64, event: u64) -> braid_status;
    pub fn braid_sync_comm_stream(c: *mut braid_comm) -> braid_status;
}
