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

use crate::tune::{THREAD_DESCRIPTOR_SPAN, THREAD_HEAD_WAIT};

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
pub struct Layout {
    from: isize,
    to: isize,
    /// The robust list head's offset from the thread pointer.
    head_from_tp: isize,
    /// Where a descriptor keeps its `tid` word, from the thread pointer,
    /// where the descriptor can be recognised by its content (x86_64
    /// glibc: the TCB's `tcb` and `self` words, at TP and TP + 16, both
    /// point to TP). `None` elsewhere.
    tid_from_tp: Option<isize>,
}

/// The TCB's words that point to the TCB itself (x86_64 `tcbhead_t`:
/// `tcb` at 0, `self` at 16).
const SELF_WORDS: [usize; 2] = [0, 16];

impl Layout {
    pub fn of_this_process() -> Result<Layout, Unknown> {
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
                head_from_tp: 0,
                tid_from_tp: None,
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
        Ok(Layout {
            from: lo,
            to: hi,
            head_from_tp: head - tp,
            tid_from_tp: tid_word(tp as usize, head as usize, me).map(|a| a as isize - tp),
        })
    }
}

/// Where this thread's descriptor keeps its `tid` word (glibc: `tid`
/// sits just before `robust_prev` and `robust_head`), if the descriptor
/// at `tp` can be recognised by its self-pointing words.
fn tid_word(tp: usize, head: usize, me: i32) -> Option<usize> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    // SAFETY: this thread's own TCB and descriptor, mapped for its life;
    // read only, and the words read (tcb, self, the tid slots just below
    // the robust head) are written before the thread runs user code.
    unsafe {
        if SELF_WORDS
            .iter()
            .any(|&o| ((tp + o) as *const usize).read_volatile() != tp)
        {
            return None;
        }
        (head.saturating_sub(64)..head)
            .step_by(4)
            .rev()
            .find(|&a| (a as *const i32).read_volatile() == me)
    }
}

/// Repairs what a thread that exited while its descriptor was out lost:
/// the kernel's `put_user(0, clear_child_tid)` (mm_release), which fails
/// for an exiting task instead of waiting on the userfaultfd.
///
/// `parked(addr)` gives where the bytes of application page `addr` are
/// while it is out (`None` if it is not out). Every out page is searched
/// for a descriptor (its self-pointing TCB words name the address it
/// lives at); one whose `tid` word is not 0 while no live thread has that
/// descriptor belongs to a thread that has exited (a thread leaves
/// /proc/self/task only after mm_release): its `tid` word is cleared in
/// the parked copy, as the kernel would have, and its application
/// address returned, to be woken (FUTEX_WAKE) once the page is back.
/// A descriptor whose `tid` word is already 0 is returned too: its
/// thread's clear landed, but the kernel's wake just after it may have
/// found the page out.
/// Returns nothing where descriptors cannot be recognised here.
pub fn repair_lost_exits(l: &Layout, out: &[(usize, usize)], page: usize) -> Repaired {
    let mut r = Repaired::default();
    let Some(tid_from_tp) = l.tid_from_tp else {
        return r;
    };
    let parked = |addr: usize| -> Option<usize> {
        let base = addr / page * page;
        out.iter()
            .find(|&&(a, _)| a == base)
            .map(|&(_, p)| p + addr - base)
    };
    for &(app, at) in out {
        for off in (0..page).step_by(64) {
            let tp = app + off;
            // SAFETY: `at` is a parked page, present in our staging area
            // for the batch; read only.
            let is_tcb = SELF_WORDS
                .iter()
                .all(|&o| unsafe { ((at + off + o) as *const usize).read_volatile() } == tp);
            if !is_tcb {
                continue;
            }
            let tid_app = (tp as isize + tid_from_tp) as usize;
            let Some(tid_at) = parked(tid_app) else {
                continue; // in place: the kernel's clear reached it
            };
            // SAFETY: a word of a parked page (as above); aligned as
            // glibc aligns `tid`.
            let tid = unsafe { (tid_at as *const i32).read_volatile() };
            if tid == 0 {
                // Exited, and the clear landed, but maybe not the wake
                // that follows it: the page may have been taken between
                // the two, and the wake (a shared futex key needs the
                // page) then fails for the exiting task. Wake again; a
                // futex waiter must take a spurious wake anyway.
                r.wake.push(tid_app);
                continue;
            }
            let alive =
                robust_head(tid).is_some_and(|h| h as isize - l.head_from_tp == tp as isize);
            if alive {
                continue;
            }
            // SAFETY: as above; the page is ours until it is installed.
            unsafe { (tid_at as *mut i32).write_volatile(0) };
            r.wake.push(tid_app);
            r.cleared += 1;
        }
    }
    r
}

/// What [`repair_lost_exits`] did.
#[derive(Debug, Default)]
pub struct Repaired {
    /// `tid` words to wake once their pages are back.
    pub wake: Vec<usize>,
    /// Of those, words it cleared (their threads' clear was lost).
    pub cleared: usize,
}

/// Wakes every waiter on the `tid` words [`repair_lost_exits`] cleared,
/// once their pages are back (both the shared wake the kernel does at
/// exit, which glibc's `pthread_join` waits for, and a private one).
pub fn wake(words: &[usize]) {
    for &w in words {
        for op in [
            libc::FUTEX_WAKE,
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
        ] {
            // SAFETY: FUTEX_WAKE reads no memory of the word's; a wrong
            // address only fails.
            unsafe { libc::syscall(libc::SYS_futex, w, op, i32::MAX, 0usize, 0usize, 0) };
        }
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
pub fn exit_areas(layout: &Layout, page: usize) -> Result<Vec<(usize, usize)>, Unknown> {
    let tids = tids().map_err(|_| Unknown { tid: 0 })?;
    // Read after the thread list: a thread created since has its stack
    // mapped already.
    let maps = mappings();
    let mut out = Vec::with_capacity(tids.len());
    for tid in tids {
        let mut head = robust_head(tid);
        // A glibc thread sets its head in its first instructions, once it
        // is first scheduled, which on a busy machine can take a while; an
        // exiting one drops its head (futex_exit_release) just before it
        // disappears.
        let t = std::time::Instant::now();
        while head == Some(0) && t.elapsed() < THREAD_HEAD_WAIT {
            std::thread::sleep(std::time::Duration::from_micros(50));
            head = robust_head(tid);
        }
        let head = match head {
            None => continue, // exited: nothing of it is left to write
            Some(0) => return Err(Unknown { tid }),
            Some(h) => h as isize,
        };
        let s = (head + layout.from).max(0) as usize / page * page;
        let e = ((head + layout.to) as usize).next_multiple_of(page);
        // The descriptor, its static TLS and rseq area lie in the mapping
        // that holds the head (glibc puts them at the top of the thread's
        // stack): the span must not reach into a neighbour, which would
        // leave an unrelated page of the range in place for nothing (seen:
        // a new thread's stack mapped right next to the range).
        let (s, e) = match maps
            .iter()
            .find(|&&(a, b)| a <= head as usize && (head as usize) < b)
        {
            Some(&(a, b)) => (s.max(a), e.min(b)),
            None => (s, e),
        };
        out.push((s, e));
    }
    Ok(out)
}

/// `[start, end)` of every mapping of this process (empty where
/// /proc/self/maps cannot be read: the spans are then not clipped).
fn mappings() -> Vec<(usize, usize)> {
    let text = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
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
            let l = Layout::of_this_process().expect("glibc threads have robust lists");
            let areas = exit_areas(&l, page).expect("glibc threads have robust lists");
            if cfg!(target_arch = "x86_64") {
                assert!(l.tid_from_tp.is_some(), "glibc descriptor recognised");
            }
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
