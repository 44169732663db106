//! Large output buffers: capacity reserved without touching it, and on Linux
//! marked for transparent huge pages (`madvise(MADV_HUGEPAGE)`), so that the
//! first write faults in 2 MiB pages instead of 4 KiB ones. A fresh 64 MiB
//! output otherwise costs 16384 page faults — more than the rotation itself.

/// Below this many bytes the advice is not worth a system call.
const HUGE_MIN_BYTES: usize = 4 << 20;

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::{c_int, c_void};
    extern "C" {
        pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    }
    pub const MADV_HUGEPAGE: c_int = 14;
}

/// Advises the kernel to back the 2 MiB-aligned interior of
/// `[ptr, ptr + bytes)` with huge pages (Linux; a no-op elsewhere, and
/// failures are ignored: it is only advice).
pub(crate) fn advise_huge(ptr: *mut u8, bytes: usize) {
    if bytes < HUGE_MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + bytes) & !(HUGE - 1);
        if end > start {
            // SAFETY: the range lies inside an allocation we own; MADV_HUGEPAGE
            // does not change its contents or validity.
            unsafe {
                sys::madvise(start as *mut _, end - start, sys::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ptr;
}

/// An empty `Vec` with capacity for exactly `n` elements, huge-page advised.
pub(crate) fn with_capacity_huge<T>(n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise_huge(v.as_mut_ptr() as *mut u8, n * std::mem::size_of::<T>());
    v
}

/// Touches every page of `[ptr, ptr + bytes)` from all rayon threads, each
/// on its own contiguous 2 MiB pieces, so that the kernel zeroes the fresh
/// pages in parallel without two threads faulting the same huge page (a
/// tiled kernel writing across the whole buffer would). Writes zeros.
///
/// # Safety
/// `ptr` must be valid for writes of `bytes` bytes that nobody else reads or
/// writes meanwhile; the bytes are left zeroed.
pub(crate) unsafe fn prefault(ptr: *mut u8, bytes: usize) {
    use rayon::prelude::*;
    if bytes < HUGE_MIN_BYTES {
        return;
    }
    const PIECE: usize = 2 << 20;
    const PAGE: usize = 4096;
    let base = ptr as usize;
    (0..bytes.div_ceil(PIECE)).into_par_iter().for_each(|i| {
        let start = i * PIECE;
        let end = (start + PIECE).min(bytes);
        let mut off = start;
        while off < end {
            // SAFETY: inside the caller's range.
            unsafe { std::ptr::write_volatile((base + off) as *mut u8, 0) };
            off += PAGE;
        }
    });
}
