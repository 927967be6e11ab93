//! The SIGBUS handler that turns a fault inside a registered copy routine
//! into a return of "bytes not copied", and passes every other fault on.
//!
//! This is the user-space twin of the kernel's exception table: the handler
//! looks the faulting PC up in the table the assembler gathered beside the
//! routines ([`crate::arch::x86_64::mc::fixup_for`]) and, on a hit,
//! rewrites the PC in the saved context to the fixup, so the interrupted
//! routine returns normally. No stack is unwound and no setjmp/longjmp
//! crosses Rust frames. A fault anywhere else goes to the handler installed
//! before ours, or gets the default action (the process dies with SIGBUS,
//! exactly as without foliokit).

use std::cell::Cell;
use std::sync::OnceLock;

use super::HandlerState;
use crate::arch::x86_64::mc::fixup_for;

/// The disposition SIGBUS had before foliokit's handler.
#[derive(Clone, Copy)]
struct Previous(libc::sigaction);

// SAFETY: `sigaction` is plain data (integers, a mask and function
// addresses); sharing it read-only between threads is sound.
unsafe impl Sync for Previous {}
// SAFETY: as above.
unsafe impl Send for Previous {}

// Published before the handler is installed, so the handler always finds
// it; it reads it with a lock-free `OnceLock::get`. (The fault table needs
// no publishing: the linker wrote it, read-only, before any code ran.)
static PREVIOUS: OnceLock<Previous> = OnceLock::new();
static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();

thread_local! {
    /// `si_code` and `si_addr` of the last fault this thread recovered from.
    /// Const-initialised with no destructor, so touching it from the signal
    /// handler does not allocate or lock.
    static LAST_FAULT: Cell<(i32, usize)> = const { Cell::new((0, 0)) };
}

/// Installs the handler once per process (thread-safe; concurrent callers
/// wait for the first). Returns the errno of `sigaction` if that failed.
pub fn install() -> Result<(), i32> {
    *INSTALLED.get_or_init(do_install)
}

fn do_install() -> Result<(), i32> {
    // SAFETY: zeroed sigaction structs are valid "empty" values; the calls
    // only read/write the structs we pass.
    unsafe {
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut previous) != 0 {
            return Err(*libc::__errno_location());
        }
        PREVIOUS.get_or_init(|| Previous(previous));
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        // Every signal blocked while it runs: an application's handler
        // must not land on this handler's (alternate, small) stack. A
        // handler it chains to gets the mask it would have had.
        libc::sigfillset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
            return Err(*libc::__errno_location());
        }
        Ok(())
    }
}

/// Asks the kernel which handler SIGBUS has now.
pub fn state() -> HandlerState {
    if INSTALLED.get() != Some(&Ok(())) {
        return HandlerState::NotInstalled;
    }
    // SAFETY: a zeroed sigaction is a valid out-parameter; a null new
    // action only queries.
    let current = unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) != 0 {
            // Cannot tell (a seccomp filter may refuse the query): nothing
            // says it was replaced, so keep the copies working.
            return HandlerState::Installed;
        }
        cur.sa_sigaction
    };
    if current == on_sigbus as *const () as usize {
        HandlerState::Installed
    } else {
        HandlerState::Replaced
    }
}

/// Clears this thread's record of the last recovered fault, returning
/// what it held: an mc copy in a signal handler that interrupted another
/// between its fault and its reading of the record puts it back.
pub fn reset_last_fault() -> (i32, usize) {
    LAST_FAULT.with(|c| c.replace((0, 0)))
}

/// Puts back a record [`reset_last_fault`] returned.
pub fn restore_last_fault(v: (i32, usize)) {
    LAST_FAULT.with(|c| c.set(v));
}

/// Whether this thread blocks SIGBUS (one that takes its signals through
/// signalfd does): the kernel then kills the process for a fault it raises
/// instead of running any handler, so no mc copy can recover there.
/// Unblocking it for the copy would hand a SIGBUS pending for the
/// application's signalfd to this handler instead.
pub fn sigbus_blocked() -> bool {
    // SAFETY: sigset_t is plain data, valid zeroed; the call only reads this
    // thread's mask into it.
    unsafe {
        let mut now: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now);
        libc::sigismember(&now, libc::SIGBUS) == 1
    }
}

/// `(si_code, si_addr)` of the last fault this thread recovered from.
pub fn last_fault() -> (i32, usize) {
    LAST_FAULT.with(Cell::get)
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo and ucontext for SA_SIGINFO
    // handlers; we only read them and write the saved RIP.
    unsafe {
        let uc = ctx.cast::<libc::ucontext_t>();
        let pc_slot = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
        let pc = *pc_slot as usize;
        // Only a fault the kernel raised for this access is ours: a SIGBUS
        // sent by kill() (si_code <= 0) or an asynchronous poison report
        // (BUS_MCEERR_AO) that happens to land mid-copy goes on.
        let code = (*info).si_code;
        let ours = code > 0 && code != libc::BUS_MCEERR_AO;
        if let Some(fixup) = fixup_for(pc).filter(|_| ours) {
            LAST_FAULT.with(|c| c.set(((*info).si_code, (*info).si_addr() as usize)));
            *pc_slot = fixup as i64;
            return;
        }
        chain(sig, info, ctx);
    }
}

/// Hands a fault that is not ours to whoever had SIGBUS before us.
///
/// # Safety
/// Called only from the signal handler with the kernel's arguments.
unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let previous = PREVIOUS.get().map(|p| p.0);
    // SAFETY: the previous handler's address came from sigaction itself, and
    // its flags say which signature it has.
    unsafe {
        // The previous handler runs with the mask the kernel would have
        // given it: the interrupted code's, plus its own sa_mask, plus
        // SIGBUS unless SA_NODEFER (this handler runs with all blocked).
        let with_its_mask = |p: &libc::sigaction, call: &dyn Fn()| {
            let uc = ctx.cast::<libc::ucontext_t>();
            let mut m: libc::sigset_t = (*uc).uc_sigmask;
            for s in 1..=libc::SIGRTMAX() {
                if libc::sigismember(&p.sa_mask, s) == 1 {
                    libc::sigaddset(&mut m, s);
                }
            }
            if p.sa_flags & libc::SA_NODEFER == 0 {
                libc::sigaddset(&mut m, sig);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, &m, &mut old);
            call();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        };
        // A fault the kernel raised for an access (si_code > 0, other than
        // an asynchronous poison report) recurs when the handler returns,
        // and cannot be ignored: the kernel delivers it with the default
        // action instead, where returning would fault again, forever.
        let code = (*info).si_code;
        let recurs = code > 0 && code != libc::BUS_MCEERR_AO;
        let ignored = |p: &libc::sigaction| p.sa_sigaction == libc::SIG_IGN && !recurs;
        // SIG_DFL and SIG_IGN are values, not functions, whatever the
        // flags say: they are tested first.
        let special = |p: &libc::sigaction| {
            p.sa_sigaction == libc::SIG_DFL || p.sa_sigaction == libc::SIG_IGN
        };
        match previous {
            Some(p) if !special(&p) && p.sa_flags & libc::SA_SIGINFO != 0 => {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(p.sa_sigaction);
                with_its_mask(&p, &|| f(sig, info, ctx));
            }
            Some(p) if ignored(&p) => {}
            Some(p) if !special(&p) => {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                with_its_mask(&p, &|| f(sig));
            }
            _ => {
                // Default action: restore it; a synchronous fault then recurs
                // on return and kills the process as it would have anyway; a
                // signal that will not recur (sent by kill(), or an
                // asynchronous poison report) is raised again.
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
                if !recurs {
                    libc::raise(sig);
                }
            }
        }
    }
}
