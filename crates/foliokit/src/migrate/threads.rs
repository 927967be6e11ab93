//! Where the threads of this process keep the words the kernel writes
//! when they exit, so that relocation never has one of those pages out.
//!
//! At exit (kernel/fork.c `mm_release`) the kernel clears the thread's
//! `clear_child_tid` word and wakes its futex (that is what `pthread_join`
//! waits for), and walks its robust list (`exit_robust_list`); while
//! running it updates its rseq area. For an exiting task
//! `handle_userfault` does not wait (it bails for PF_EXITING), so with the
//! page out the clear and the wake are lost and `pthread_join` sleeps
//! forever. glibc keeps all three in the thread's descriptor: `tid` (the
//! `clear_child_tid` word) and `robust_head` in `struct pthread` at the
//! thread pointer (TP), the rseq area at `TP + __rseq_offset` (inside
//! `struct pthread` in 2.35-2.39, in static TLS just below it since);
//! with `pthread_attr_setstack` all of it sits at the top of a stack the
//! application chose, which can be inside the range.
//!
//! How relocation knows where they are: every thread's robust list head
//! (`get_robust_list(tid)`, which glibc sets to `&pd->robust_head` as the
//! thread starts) gives its descriptor, because the head's offset from
//! the thread pointer is the same in every thread of the process (this
//! thread's TP and head give it). A thread without a robust list (a raw
//! `clone`, musl before its first robust mutex, a glibc thread in its
//! first instructions) cannot be placed: relocation then refuses.

use std::io;

use crate::tune::{THREAD_DESCRIPTOR_SPAN, THREAD_HEAD_RETRIES};

/// A thread whose exit-time words cannot be located.
#[derive(Debug, Clone, Copy)]
pub struct Unknown {
    pub tid: i32,
}

/// The robust list head of thread `tid` (0 if it has none); `None` if the
/// thread is gone.
fn robust_head(tid: i32) -> Option<usize> {
    let mut head: usize = 0;
    let mut len: usize = 0;
    // SAFETY: both out-pointers are ours and large enough; the kernel
    // only writes them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            tid as libc::c_long,
            &mut head as *mut usize,
            &mut len as *mut usize,
        )
    };
    (rc == 0).then_some(head)
}

/// This thread's thread pointer.
#[cfg(target_arch = "x86_64")]
fn thread_pointer() -> Option<usize> {
    let tp: usize;
    // SAFETY: reads the TCB's self pointer at %fs:0, which glibc and musl
    // keep on x86_64 for every thread. Inputs: none; output: tp; no
    // memory written, flags untouched.
    unsafe {
        std::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    Some(tp)
}

/// This thread's thread pointer.
#[cfg(target_arch = "aarch64")]
fn thread_pointer() -> Option<usize> {
    let tp: usize;
    // SAFETY: reads TPIDR_EL0. Inputs: none; output: tp; no memory.
    unsafe {
        std::arch::asm!("mrs {}, tpidr_el0", out(reg) tp, options(nomem, nostack, preserves_flags))
    };
    Some(tp)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn thread_pointer() -> Option<usize> {
    None
}

/// glibc's `__rseq_offset` and `__rseq_size` (2.35+), if exported and an
/// area is registered.
fn rseq_layout() -> Option<(isize, usize)> {
    // SAFETY: looks up data symbols of the C library by NUL-terminated
    // names; each is read once as the type glibc declares it
    // (`const ptrdiff_t __rseq_offset`, `const unsigned int __rseq_size`).
    unsafe {
        let off = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
        let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
        if off.is_null() || size.is_null() {
            return None;
        }
        let size = *(size as *const libc::c_uint) as usize;
        // The kernel's struct rseq is 32 bytes even where glibc says 20.
        (size > 0).then(|| (*(off as *const isize), size.max(32)))
    }
}

/// How to get from a thread's robust list head to the bytes the kernel
/// writes at its exit or on its behalf: `(from, to)` offsets around the
/// head.
#[derive(Debug, Clone, Copy)]
struct Layout {
    from: isize,
    to: isize,
}

impl Layout {
    fn of_this_process() -> Result<Layout, Unknown> {
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let head = match robust_head(0) {
            Some(h) if h != 0 => h as isize,
            _ => return Err(Unknown { tid: me }),
        };
        let span = THREAD_DESCRIPTOR_SPAN as isize;
        let Some(tp) = thread_pointer().map(|t| t as isize) else {
            // Without the thread pointer: a generous span either side.
            return Ok(Layout {
                from: -span,
                to: span,
            });
        };
        // struct pthread spans [TP, TP + sizeof) on x86_64 (TLS variant
        // II); below TP on aarch64 (variant I). Cover both ends.
        let mut lo = (tp - span).min(head) - head;
        let mut hi = (tp + span).max(head + 24) - head;
        if let Some((off, size)) = rseq_layout() {
            lo = lo.min(tp + off - head);
            hi = hi.max(tp + off + size as isize - head);
        }
        Ok(Layout { from: lo, to: hi })
    }
}

/// The threads of this process now.
fn tids() -> io::Result<Vec<i32>> {
    Ok(std::fs::read_dir("/proc/self/task")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// Address ranges `[start, end)` holding a live thread's exit-time words
/// (descriptor with `tid` and robust list head, rseq area), rounded out to
/// pages; or the first thread that cannot be placed.
pub fn exit_areas(page: usize) -> Result<Vec<(usize, usize)>, Unknown> {
    let layout = Layout::of_this_process()?;
    let tids = tids().map_err(|_| Unknown { tid: 0 })?;
    let mut out = Vec::with_capacity(tids.len());
    for tid in tids {
        let mut head = robust_head(tid);
        // A glibc thread sets its head in its first instructions.
        for _ in 0..THREAD_HEAD_RETRIES {
            if head != Some(0) {
                break;
            }
            std::thread::yield_now();
            head = robust_head(tid);
        }
        let head = match head {
            None => continue, // exited: nothing of it is left to write
            Some(0) => return Err(Unknown { tid }),
            Some(h) => h as isize,
        };
        let s = (head + layout.from).max(0) as usize / page * page;
        let e = ((head + layout.to) as usize).next_multiple_of(page);
        out.push((s, e));
    }
    Ok(out)
}

/// Whether `addr` lies in one of `areas`.
pub fn inside(areas: &[(usize, usize)], addr: usize) -> bool {
    areas.iter().any(|&(s, e)| addr >= s && addr < e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_here_is_placed_and_covers_its_descriptor() {
        let page = crate::batch::page_size();
        let t = std::thread::spawn(move || {
            let areas = exit_areas(page).expect("glibc threads have robust lists");
            let head = robust_head(0).unwrap();
            assert!(inside(&areas, head), "own head {head:#x} in {areas:x?}");
            if let Some(tp) = thread_pointer() {
                assert!(inside(&areas, tp), "own TP {tp:#x} in {areas:x?}");
            }
            areas.len()
        });
        assert!(t.join().unwrap() >= 2, "this thread and the spawned one");
    }
}
