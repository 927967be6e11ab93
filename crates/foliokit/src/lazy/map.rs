//! The lazy fill's own anonymous mappings (staging, zeros, the room for
//! messages read during a fork): made and grown by system calls alone,
//! never through the allocator.

use std::io;

/// An owned private anonymous mapping, unmapped on drop.
pub(super) struct Map {
    pub(super) base: usize,
    pub(super) len: usize,
}

impl Map {
    pub(super) fn new(len: usize, prot: libc::c_int) -> io::Result<Map> {
        // SAFETY: a fresh private anonymous mapping; nothing is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map {
            base: p as usize,
            len,
        })
    }

    /// Grows the mapping to `len` bytes, moving it if the kernel must (its
    /// contents move with it); false, and nothing changed, when the kernel
    /// has no room or memory for it.
    pub(super) fn grow(&mut self, len: usize) -> bool {
        // SAFETY: our own mapping of `self.len` bytes; MAYMOVE lets the
        // kernel move it, after which only the returned address is used.
        let p = unsafe {
            libc::mremap(
                self.base as *mut libc::c_void,
                self.len,
                len,
                libc::MREMAP_MAYMOVE,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        self.base = p as usize;
        self.len = len;
        true
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
