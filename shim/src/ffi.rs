//! Raw declarations the eerie-sys bindings lack (IREE's io-parameters
//! sources, compiled by this crate's build script), and the one function
//! that turns an `iree_status_t` into an [`Error`].

use std::ffi::c_void;

pub(crate) use eerie_sys::runtime as sys;

use crate::error::Error;

// Opaque IREE io types.
pub(crate) type ParameterIndex = c_void;
pub(crate) type ParameterProvider = c_void;

unsafe extern "C" {
    pub(crate) fn iree_allocator_libc_ctl(
        self_: *mut c_void,
        command: sys::iree_allocator_command_t,
        params: *const c_void,
        inout_ptr: *mut *mut c_void,
    ) -> sys::iree_status_t;
    pub(crate) fn iree_io_parameter_index_create(
        host_allocator: sys::iree_allocator_t,
        out_index: *mut *mut ParameterIndex,
    ) -> sys::iree_status_t;
    pub(crate) fn iree_io_parameter_index_release(index: *mut ParameterIndex);
    pub(crate) fn iree_io_parameter_index_count(index: *mut ParameterIndex) -> usize;
    pub(crate) fn iree_io_parse_file_index(
        path: sys::iree_string_view_t,
        file_handle: *mut sys::iree_io_file_handle_t,
        index: *mut ParameterIndex,
        host_allocator: sys::iree_allocator_t,
    ) -> sys::iree_status_t;
    pub(crate) fn iree_io_parameter_index_provider_create(
        scope: sys::iree_string_view_t,
        index: *mut ParameterIndex,
        max_concurrent_operations: usize,
        host_allocator: sys::iree_allocator_t,
        out_provider: *mut *mut ParameterProvider,
    ) -> sys::iree_status_t;
    pub(crate) fn iree_io_parameter_provider_release(provider: *mut ParameterProvider);
    /// `csrc/parameter_alias.c`: adds `alias` for the entry `key` names.
    pub(crate) fn mlxcel_parameter_index_alias(
        index: *mut ParameterIndex,
        key: sys::iree_string_view_t,
        alias: sys::iree_string_view_t,
    ) -> sys::iree_status_t;
    /// `csrc/parameter_alias.c`: adds `key` as the first `length` bytes of `handle`.
    pub(crate) fn mlxcel_parameter_index_add_handle(
        index: *mut ParameterIndex,
        key: sys::iree_string_view_t,
        handle: *mut sys::iree_io_file_handle_t,
        length: u64,
    ) -> sys::iree_status_t;
    pub(crate) fn iree_io_parameters_module_create(
        instance: *mut sys::iree_vm_instance_t,
        provider_count: usize,
        providers: *const *mut ParameterProvider,
        host_allocator: sys::iree_allocator_t,
        out_module: *mut *mut sys::iree_vm_module_t,
    ) -> sys::iree_status_t;
}

/// IREE's libc allocator (the runtime's system allocator).
pub(crate) fn allocator() -> sys::iree_allocator_t {
    sys::iree_allocator_t { self_: std::ptr::null_mut(), ctl: Some(iree_allocator_libc_ctl) }
}

/// A string view borrowing `s`; valid while `s` is.
pub(crate) fn string_view(s: &str) -> sys::iree_string_view_t {
    sys::iree_string_view_t { data: s.as_ptr().cast(), size: s.len() }
}

/// Copies an IREE string view into an owned string.
///
/// # Safety
/// `view` must point at `size` readable bytes (or be empty).
pub(crate) unsafe fn owned_string(view: sys::iree_string_view_t) -> String {
    if view.data.is_null() || view.size == 0 {
        return String::new();
    }
    // SAFETY: the caller guarantees `data` points at `size` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(view.data.cast::<u8>(), view.size) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// `IREE_STATUS_DEFERRED` and `IREE_STATUS_DEADLINE_EXCEEDED`: the answers of
/// a fence not yet signalled, which carry no payload.
pub(crate) const STATUS_DEFERRED: usize = 17;
pub(crate) const STATUS_DEADLINE_EXCEEDED: usize = 4;

/// A status's code (`iree_status_code`: the low five bits).
pub(crate) fn status_code(status: sys::iree_status_t) -> usize {
    status as usize & 0x1F
}

/// Converts a status to a result, consuming (freeing) the status.
pub(crate) fn check(status: sys::iree_status_t, operation: &'static str) -> Result<(), Error> {
    if status.is_null() {
        return Ok(());
    }
    let a = allocator();
    let mut buffer: *mut std::os::raw::c_char = std::ptr::null_mut();
    let mut length = 0usize;
    // SAFETY: `status` is a live non-OK status owned by us; to_string writes an
    // allocation we free with the same allocator; ignore() frees the status.
    let message = unsafe {
        let message = if sys::iree_status_to_string(status, &a, &mut buffer, &mut length) {
            let text = owned_string(sys::iree_string_view_t { data: buffer, size: length });
            sys::iree_allocator_free(a, buffer.cast());
            text
        } else {
            "unknown error (the status could not be formatted)".to_owned()
        };
        sys::iree_status_ignore(status);
        message
    };
    Err(Error::Iree { operation, message })
}
