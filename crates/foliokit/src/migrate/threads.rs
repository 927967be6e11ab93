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

use crate::params::{PID_WINDOW_MAX, THREAD_DESCRIPTOR_SPAN, THREAD_HEAD_WAIT, THREAD_STATE_TRIES};

/// Why the threads' exit-time words cannot be located.
#[derive(Debug, Clone, Copy)]
pub enum Unknown {
    /// This thread (0: the list of threads) could not be placed.
    Thread(i32),
    /// `/proc` belongs to another pid namespace than the one this
    /// process's ids are allocated in (`NSpid` lists this many ids): the
    /// ids this module reads and the ids it looks up would not agree.
    PidNamespace(usize),
}

impl std::fmt::Display for Unknown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unknown::Thread(0) => write!(f, "the threads could not be listed"),
            Unknown::Thread(tid) => write!(f, "thread {tid} has no robust list"),
            Unknown::PidNamespace(n) => {
                write!(f, "/proc shows another pid namespace ({n} ids in NSpid)")
            }
        }
    }
}

/// How many pid namespaces `/proc/self/status`'s `NSpid` spans, from the
/// one `/proc` was mounted in down to this process's own (1: the same).
fn pid_namespace_levels(status: &str) -> usize {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map_or(1, |ids| ids.split_whitespace().count())
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
    /// Where exactly the kernel's exit-time words sit, from the robust
    /// list head, where they are known (x86_64 glibc with
    /// `PR_GET_TID_ADDRESS`): the `tid` word, and the rseq area (offset,
    /// size). Then only their pages and the head's are kept in place,
    /// instead of the whole span `from..to`, which can reach into a
    /// neighbouring mapping (a thread stack right next to the range).
    exact: Option<(isize, Option<(isize, usize)>)>,
    /// Where a descriptor keeps its `tid` word, from the thread pointer,
    /// where the descriptor can be recognised by its content (x86_64
    /// glibc: the TCB's `tcb` and `self` words, at TP and TP + 16, both
    /// point to TP). `None` elsewhere.
    tid_from_tp: Option<isize>,
    /// glibc's stack and pointer guards (x86_64 TCB words at TP + 0x28 and
    /// TP + 0x30), the same random values in every thread of the process:
    /// with the self-pointing words they tell a thread descriptor from
    /// application data that merely points to itself. `None` where they
    /// cannot be read: then nothing is repaired.
    guards: Option<[usize; 2]>,
}

/// The TCB's guard words (x86_64 glibc `tcbhead_t`: `stack_guard` at
/// 0x28, `pointer_guard` at 0x30).
const GUARD_WORDS: [usize; 2] = [0x28, 0x30];

/// The TCB's words that point to the TCB itself (x86_64 `tcbhead_t`:
/// `tcb` at 0, `self` at 16).
const SELF_WORDS: [usize; 2] = [0, 16];

impl Layout {
    pub fn of_this_process() -> Result<Layout, Unknown> {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let levels = pid_namespace_levels(&status);
        if levels != 1 {
            return Err(Unknown::PidNamespace(levels));
        }
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let head = match robust_head(0) {
            Some(h) if h != 0 => h as isize,
            _ => return Err(Unknown::Thread(me)),
        };
        let span = THREAD_DESCRIPTOR_SPAN as isize;
        let Some(tp) = thread_pointer().map(|t| t as isize) else {
            // Without the thread pointer: a generous span either side.
            return Ok(Layout {
                from: -span,
                to: span,
                exact: None,
                tid_from_tp: None,
                guards: None,
            });
        };
        // struct pthread spans [TP, TP + sizeof) on x86_64 (TLS variant
        // II); below TP on aarch64 (variant I). Cover both ends.
        let mut lo = (tp - span).min(head) - head;
        let mut hi = (tp + span).max(head + 24) - head;
        let rseq = rseq_layout();
        if let Some((off, size)) = rseq {
            lo = lo.min(tp + off - head);
            hi = hi.max(tp + off + size as isize - head);
        }
        let tid_from_tp = tid_word(tp as usize).map(|a| a as isize - tp);
        Ok(Layout {
            from: lo,
            to: hi,
            exact: tid_from_tp.map(|t| {
                (
                    tp + t - head,
                    rseq.map(|(off, size)| (tp + off - head, size)),
                )
            }),
            tid_from_tp,
            guards: tid_from_tp.and_then(|_| guards(tp as usize)),
        })
    }
}

/// Where this thread's descriptor keeps its `tid` word: the kernel's own
/// `clear_child_tid` pointer for this thread (`PR_GET_TID_ADDRESS`), kept
/// only where it lies in a descriptor recognisable by its self-pointing
/// TCB words at `tp`. `None` otherwise (no repair is attempted then).
fn tid_word(tp: usize) -> Option<usize> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    const PR_GET_TID_ADDRESS: libc::c_int = 40;
    let mut addr: usize = 0;
    // SAFETY: the kernel writes one pointer into `addr`, ours.
    let rc = unsafe { libc::prctl(PR_GET_TID_ADDRESS, &mut addr as *mut usize) };
    if rc != 0 || addr == 0 || addr < tp || addr >= tp + crate::params::THREAD_DESCRIPTOR_SPAN {
        return None;
    }
    // SAFETY: this thread's own TCB, mapped for its life; read only.
    let tcb = SELF_WORDS
        .iter()
        .all(|&o| unsafe { ((tp + o) as *const usize).read_volatile() } == tp);
    tcb.then_some(addr)
}

/// This thread's TCB guard words (see [`Layout::guards`]).
fn guards(tp: usize) -> Option<[usize; 2]> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    // SAFETY: this thread's own TCB (recognised by `tid_word`), mapped for
    // its life; read only.
    let g = GUARD_WORDS.map(|o| unsafe { ((tp + o) as *const usize).read_volatile() });
    // An all-zero guard is no evidence at all.
    (g[0] != 0 && g[1] != 0).then_some(g)
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
    let (Some(tid_from_tp), Some(guards)) = (l.tid_from_tp, l.guards) else {
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
            // for the batch; `off + o` stays inside it (off <= page - 64,
            // o <= 0x30); read only.
            let word = |o: usize| unsafe { ((at + off + o) as *const usize).read_volatile() };
            // A descriptor: its TCB points to itself and carries the
            // process's two random guard words. Application data matching
            // all four words by chance is not a concern (2^-128).
            let is_tcb = SELF_WORDS.iter().all(|&o| word(o) == tp)
                && GUARD_WORDS.iter().zip(guards).all(|(&o, g)| word(o) == g);
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
            // A thread of ours with that tid is alive (its own, or a new one
            // that reused the tid): leave the word. A live thread's word is
            // never cleared; a reused tid at worst leaves a lost clear
            // unrepaired.
            if tid < 0 || std::path::Path::new(&format!("/proc/self/task/{tid}")).exists() {
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

/// The window in which a thread of this process can be born and die
/// unseen: from just before the first look at the threads to the end of
/// the take-out.
///
/// [`repair_lost_exits`] is only needed for a thread that starts after
/// the first look, touches its descriptor for the last time before the
/// page is taken and exits before the second look. Its id was allocated
/// before it ran, so before the take-out ended: after [`Births::open`]
/// read the pid namespace's last allocated id, and no later than
/// [`Births::seal`] reads it again. Every id in between is then checked
/// ([`Births::may_have_lost`], after the second look): a live task with
/// one is another process's, or a thread of ours alive at the second
/// look, which put its pages back. Only an id whose task is gone can have
/// been a thread that died unseen: then the parked pages are searched.
/// A few stat calls per id allocated meanwhile, instead of a read of
/// every parked byte.
///
/// A `clone` in flight when the window opens allocated its child's id
/// before it, while the child joins the thread list (where the first look
/// finds threads) only at the end of the call. So the window opens only
/// when no other thread of this process is inside `clone`, `clone3`,
/// `fork` or `vfork` at some instant after the id is read
/// (`/proc/self/task/*/syscall`; a thread that stays on a CPU cannot be
/// told, and leaves the window unknown). Ids come from the namespace's cyclic allocator: a
/// window that wrapped, or saw more than `PID_WINDOW_MAX` ids, is unknown
/// too. Assumed, while a batch is out: nothing rewinds `ns_last_pid`
/// (checkpoint and restore tools), no thread is made with an id chosen by
/// `clone3`'s `set_tid` (it does not move the allocator's cursor, so it
/// falls outside the window; that needs CAP_CHECKPOINT_RESTORE), the
/// namespace's `pid_max` is not so small that the ids wrap all the way
/// round within one batch, and no thread enters `clone` through the 32-bit
/// `int 0x80` entry (its syscall numbers are not the ones looked for).
#[derive(Debug, Clone, Copy)]
pub struct Births {
    /// The namespace's last id when the window opened; `None`: unknown.
    open: Option<u32>,
    /// And when it was sealed.
    sealed: Option<u32>,
}

fn last_pid() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether thread `tid` of this process may be inside a call that
/// creates a task (or is on a CPU, where the kernel cannot say, after a
/// few yields to let it settle: a helper that just finished its part of
/// the last batch is about to sleep).
fn maybe_cloning(tid: i32) -> bool {
    for _ in 0..THREAD_STATE_TRIES {
        let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")) else {
            // Gone meanwhile: it creates nothing more. Unreadable: unknown.
            return std::path::Path::new(&format!("/proc/self/task/{tid}")).exists();
        };
        // "running", or a number and the call's arguments.
        match s.split_whitespace().next().map(str::parse::<libc::c_long>) {
            Some(Ok(nr)) => {
                return [
                    libc::SYS_clone,
                    libc::SYS_clone3,
                    #[cfg(target_arch = "x86_64")]
                    libc::SYS_fork,
                    #[cfg(target_arch = "x86_64")]
                    libc::SYS_vfork,
                ]
                .contains(&nr)
            }
            _ => std::thread::yield_now(),
        }
    }
    true
}

/// Whether no live task has id `t` now (a zombie process still has one;
/// `/proc/<id>` finds threads too).
fn gone(t: u32) -> bool {
    !std::path::Path::new(&format!("/proc/{t}")).exists()
}

impl Births {
    /// Opens the window; call it before the first look.
    pub fn open() -> Births {
        let unknown = Births {
            open: None,
            sealed: None,
        };
        let Some(last) = last_pid() else {
            return unknown;
        };
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        let quiet = tids().is_ok_and(|ts| ts.iter().all(|&t| t == me || !maybe_cloning(t)));
        Births {
            open: quiet.then_some(last),
            ..unknown
        }
    }

    /// Closes the window; call it once the batch's pages are out.
    pub fn seal(&mut self) {
        self.sealed = self.open.and(last_pid());
    }

    /// Whether a thread of this process may have started after
    /// [`open`](Births::open), had its descriptor taken out, and exited
    /// before now; call it after the second look.
    pub fn may_have_lost(&self) -> bool {
        match (self.open, self.sealed) {
            (Some(a), Some(b)) => window_unclear(a, b, gone),
            _ => true,
        }
    }
}

/// Whether the ids allocated after `a` up to `b` may include a thread
/// that died unseen (`gone` tells whether an id's task is gone now).
fn window_unclear(a: u32, b: u32, gone: impl Fn(u32) -> bool) -> bool {
    b < a || b - a > PID_WINDOW_MAX || (a + 1..=b).any(gone)
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
    let tids = tids().map_err(|_| Unknown::Thread(0))?;
    let mut out = Vec::with_capacity(tids.len());
    for tid in tids {
        let mut head = robust_head(tid);
        // A zombie (a main thread that called pthread_exit) keeps its
        // task with no robust list (the kernel drops it at exit): it will
        // write nothing more.
        if head == Some(0) && zombie(tid) {
            continue;
        }
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
            Some(0) => return Err(Unknown::Thread(tid)),
            Some(h) => h as isize,
        };
        let pages = |from: isize, to: isize| {
            let s = (head + from).max(0) as usize / page * page;
            (s, ((head + to) as usize).next_multiple_of(page))
        };
        match layout.exact {
            // The head itself (the robust-list walk reads it), the tid
            // word and the rseq area: nothing else of a thread's is
            // written by the kernel at its exit.
            Some((tid, rseq)) => {
                out.push(pages(0, 24));
                out.push(pages(tid, tid + 4));
                out.extend(rseq.map(|(off, size)| pages(off, off + size as isize)));
            }
            None => out.push(pages(layout.from, layout.to)),
        }
    }
    Ok(out)
}

/// Whether thread `tid` of this process is a zombie.
fn zombie(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|r| r.1.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Whether `addr` lies in one of `areas`.
pub fn inside(areas: &[(usize, usize)], addr: usize) -> bool {
    areas.iter().any(|&(s, e)| addr >= s && addr < e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proc_of_another_pid_namespace_is_told_by_nspid() {
        assert_eq!(pid_namespace_levels("Name:\tx\nNSpid:\t4242\n"), 1);
        assert_eq!(pid_namespace_levels("NSpid:\t4242\t7\n"), 2);
        // Kernels before 4.1 have no NSpid: no namespace to disagree with.
        assert_eq!(pid_namespace_levels("Name:\tx\n"), 1);
    }

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
                // The word the kernel clears at this thread's exit.
                let word = (tp as isize + l.tid_from_tp.unwrap_or(0)) as usize;
                assert!(inside(&areas, word), "own tid word {word:#x} in {areas:x?}");
            }
            areas.len()
        });
        assert!(t.join().unwrap() >= 2, "this thread and the spawned one");
    }
}

#[cfg(test)]
mod births_tests {
    use super::*;

    #[test]
    fn only_a_window_without_gone_ids_is_clear() {
        let none_gone = |_| false;
        assert!(!window_unclear(100, 100, none_gone), "no id allocated");
        assert!(!window_unclear(100, 140, none_gone), "all alive");
        assert!(window_unclear(100, 140, |t| t == 140), "one gone");
        assert!(window_unclear(100, 101, |t| t == 101));
        assert!(!window_unclear(100, 101, |t| t == 100), "before the window");
        assert!(window_unclear(40_000, 300, none_gone), "wrapped");
        assert!(window_unclear(100, 100 + PID_WINDOW_MAX + 1, none_gone));
        assert!(!window_unclear(100, 100 + PID_WINDOW_MAX, none_gone));
    }

    #[test]
    fn a_thread_born_and_dead_inside_the_window_is_never_missed() {
        let mut b = Births::open();
        if b.open.is_none() {
            // Another test's thread on a CPU, or no ns_last_pid here: the
            // window is unknown, which is the safe answer.
            assert!(b.may_have_lost());
            eprintln!(
                "SKIP: the window could not be opened here (a thread on a CPU, or no ns_last_pid)"
            );
            return;
        }
        std::thread::spawn(|| {}).join().unwrap();
        b.seal();
        assert!(b.may_have_lost(), "a thread lived and died inside it");
    }
}

#[cfg(all(test, target_arch = "x86_64", target_env = "gnu"))]
mod repair_tests {
    use super::*;

    /// A copy of a live thread's descriptor page is recognised (its TCB
    /// words and guards), left alone while the thread lives, and repaired
    /// (tid word cleared, woken) once its tid names no thread; a page of
    /// data that merely points to itself is never touched.
    #[test]
    fn only_a_real_descriptor_of_a_dead_thread_is_repaired() {
        let page = crate::batch::page_size();
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let l = Layout::of_this_process().expect("glibc thread");
            tx.send((l, thread_pointer().unwrap())).unwrap();
            let _ = stop_rx.recv();
        });
        let (l, tp) = rx.recv().unwrap();
        let Some(tid_from_tp) = l.tid_from_tp else {
            eprintln!("SKIP: PR_GET_TID_ADDRESS unavailable: no repair is attempted here");
            stop_tx.send(()).unwrap();
            t.join().unwrap();
            return;
        };
        let tid_word = (tp as isize + tid_from_tp) as usize;
        // The descriptor's TCB and tid word, as one parked copy each page.
        let pages: Vec<usize> = {
            let mut v = vec![tp / page * page, tid_word / page * page];
            v.dedup();
            v
        };
        let copies: Vec<Vec<u8>> = pages
            .iter()
            // SAFETY: the live thread's own descriptor pages, mapped while
            // it waits; read only.
            .map(|&p| unsafe { std::slice::from_raw_parts(p as *const u8, page) }.to_vec())
            .collect();
        let parked = |c: &[Vec<u8>]| -> Vec<(usize, usize)> {
            pages
                .iter()
                .zip(c)
                .map(|(&p, c)| (p, c.as_ptr() as usize))
                .collect()
        };
        let r = repair_lost_exits(&l, &parked(&copies), page);
        assert_eq!(r.cleared, 0, "a live thread's tid word is never cleared");
        // Make the copy name a thread that does not exist.
        let mut dead = copies.clone();
        let i = pages
            .iter()
            .position(|&p| p == tid_word / page * page)
            .unwrap();
        let at = tid_word - pages[i];
        dead[i][at..at + 4].copy_from_slice(&(i32::MAX - 7).to_ne_bytes());
        let r = repair_lost_exits(&l, &parked(&dead), page);
        assert_eq!((r.cleared, r.wake.clone()), (1, vec![tid_word]));
        assert_eq!(dead[i][at..at + 4], [0; 4], "cleared in the parked copy");
        // Self-pointing data without the guards is not a descriptor.
        let mut fake = vec![0u8; page];
        let base = tp / page * page;
        for o in SELF_WORDS {
            fake[tp - base + o..tp - base + o + 8].copy_from_slice(&tp.to_ne_bytes());
        }
        let r = repair_lost_exits(&l, &[(base, fake.as_ptr() as usize)], page);
        assert_eq!((r.cleared, r.wake.len()), (0, 0));
        stop_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
