//! userfaultfd: just what relocation and the lazy fill need (missing-mode
//! registration, non-cooperative events, `UFFDIO_MOVE`, `UFFDIO_COPY`,
//! `UFFDIO_POISON`, `UFFDIO_WAKE`).
//!
//! Both open their descriptor here ([`Uffd::open_for`]: the features a
//! client needs, those it takes where the kernel has them, and one typed
//! [`UffdRefusal`] naming what is missing), and both judge a failed
//! install by the same rules ([`after`], [`retrying`]): `EAGAIN` means
//! events wait and must be read first, `ENOMEM` is retried as a fault
//! would be, `EEXIST` means someone else installed the page.
//!
//! Written here rather than taken from the `userfaultfd` crate because that
//! crate's -sys half runs bindgen (and so needs libclang) at build time and
//! does not wrap `UFFDIO_MOVE`; the uAPI below is stable kernel ABI
//! (include/uapi/linux/userfaultfd.h), checked in the tests.

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use super::errno;
use super::poll::readable;

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

// Feature bits (UFFD_FEATURE_*).
/// Fork events: a forked child's copy registered with a new descriptor.
pub const FEATURE_EVENT_FORK: u64 = 1 << 1;
/// mremap events.
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
/// Discard events (MADV_DONTNEED, MADV_REMOVE).
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
/// munmap events.
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// UFFDIO_POISON (Linux 6.6).
pub const FEATURE_POISON: u64 = 1 << 14;
/// UFFDIO_MOVE (Linux 6.8).
pub const FEATURE_MOVE: u64 = 1 << 16;

const REGISTER_MODE_MISSING: u64 = 1 << 0;
const REGISTER_MODE_WP: u64 = 1 << 1;

/// Bits of the `ioctls` mask UFFDIO_REGISTER returns (1 << _UFFDIO_*).
pub const IOCTL_COPY: u64 = 1 << 0x03;
pub const IOCTL_ZEROPAGE: u64 = 1 << 0x04;
pub const IOCTL_MOVE: u64 = 1 << 0x05;
pub const IOCTL_POISON: u64 = 1 << 0x08;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

/// `_IOC(dir, 0xAA, nr, size)` as the kernel encodes it on x86 and arm64.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (0xAA << 8) | nr
}
const READ: u64 = 2;
const RW: u64 = 3;

#[repr(C)]
#[derive(Default)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_move` and `struct uffdio_copy` share this layout.
#[repr(C)]
#[derive(Default)]
struct Transfer {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    result: i64,
}

/// `struct uffdio_poison`.
#[repr(C)]
#[derive(Default)]
struct Poison {
    range: Range,
    mode: u64,
    updated: i64,
}

/// `struct uffd_msg`: an event byte, padding, a 24-byte union.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RawMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    arg: [u64; 3],
}

const UFFDIO_API: u64 = ioc(RW, 0x3F, std::mem::size_of::<Api>());
const UFFDIO_REGISTER: u64 = ioc(RW, 0x00, std::mem::size_of::<Register>());
const UFFDIO_UNREGISTER: u64 = ioc(READ, 0x01, std::mem::size_of::<Range>());
const UFFDIO_COPY: u64 = ioc(RW, 0x03, std::mem::size_of::<Transfer>());
const UFFDIO_MOVE: u64 = ioc(RW, 0x05, std::mem::size_of::<Transfer>());
const UFFDIO_WAKE: u64 = ioc(READ, 0x02, std::mem::size_of::<Range>());
const UFFDIO_POISON: u64 = ioc(RW, 0x08, std::mem::size_of::<Poison>());
/// `USERFAULTFD_IOC_NEW` on /dev/userfaultfd (Linux 6.1).
const USERFAULTFD_IOC_NEW: u64 = 0xAA00;

/// How the descriptor was obtained, which decides what it can catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Kernel-mode accesses (read(2), futex, GUP) wait like user faults.
    AllFaults,
    /// Only user-mode faults are caught; kernel accesses to a missing
    /// page fail with EFAULT instead of waiting.
    UserModeOnly,
}

/// Why no userfaultfd with the features a client asked for can be had
/// here; nothing was registered. Relocation and the lazy fill both refuse
/// with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UffdRefusal {
    /// No userfaultfd at all (not built in, disabled, seccomp, or
    /// `vm.unprivileged_userfaultfd=0` without privileges).
    #[error("no userfaultfd: {0}")]
    NoUffd(io::Error),
    /// Only a user-mode-only userfaultfd could be had: kernel-mode
    /// accesses (read(2) into the range, futexes) would fail with EFAULT
    /// instead of waiting. A full one needs /dev/userfaultfd access,
    /// CAP_SYS_PTRACE or `vm.unprivileged_userfaultfd=1` (relocation can
    /// accept a user-mode-only one: `MigrateOptions::allow_user_mode_only`).
    #[error(
        "only a user-mode-only userfaultfd is available ({0}): kernel-mode accesses would fail \
         with EFAULT instead of waiting (a full one needs /dev/userfaultfd access, \
         CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)"
    )]
    UserModeOnly(io::Error),
    /// The kernel refused fork events (they need CAP_SYS_PTRACE); without
    /// them a child forked meanwhile would read zeros where its parent had
    /// bytes.
    #[error(
        "userfaultfd fork events need CAP_SYS_PTRACE ({0}): without them a child forked \
         meanwhile would read zeros"
    )]
    NoForkEvents(io::Error),
    /// The kernel lacks a feature or an ioctl the client depends on.
    #[error("this kernel lacks {feature} (Linux {since})")]
    KernelLacks {
        /// What is missing, e.g. `"UFFDIO_MOVE"`.
        feature: &'static str,
        /// The first Linux version that has it.
        since: &'static str,
    },
}

/// Feature bits, what to call them when missing, and the first Linux
/// with them (checked in this order).
const FEATURE_NAMES: &[(u64, &str, &str)] = &[
    (FEATURE_EVENT_REMOVE, "userfaultfd REMOVE events", "4.11"),
    (FEATURE_EVENT_UNMAP, "userfaultfd UNMAP events", "4.11"),
    (FEATURE_EVENT_REMAP, "userfaultfd REMAP events", "4.11"),
    (FEATURE_EVENT_FORK, "userfaultfd FORK events", "4.11"),
    (FEATURE_MOVE, "UFFDIO_MOVE", "6.8"),
    (FEATURE_POISON, "UFFDIO_POISON", "6.6"),
];

/// The same for the ioctls a registered range offers.
const IOCTL_NAMES: &[(u64, &str, &str)] = &[
    (IOCTL_MOVE, "UFFDIO_MOVE on this mapping", "6.8"),
    (IOCTL_COPY, "UFFDIO_COPY on this mapping", "4.3"),
    (IOCTL_ZEROPAGE, "UFFDIO_ZEROPAGE on this mapping", "4.3"),
    (IOCTL_POISON, "UFFDIO_POISON on this mapping", "6.6"),
];

/// The first of `need`'s bits missing from `have`, named from `names`.
fn lacking(
    have: u64,
    need: u64,
    names: &[(u64, &'static str, &'static str)],
) -> Option<UffdRefusal> {
    names
        .iter()
        .find(|(bit, ..)| need & bit != 0 && have & bit == 0)
        .map(|&(_, feature, since)| UffdRefusal::KernelLacks { feature, since })
}

/// Refuses unless a range whose registration returned `have` offers every
/// ioctl in `need`.
pub fn require_ioctls(have: u64, need: u64) -> Result<(), UffdRefusal> {
    lacking(have, need, IOCTL_NAMES).map_or(Ok(()), Err)
}

/// A descriptor [`Uffd::open_for`] opened.
#[derive(Debug)]
pub struct Opened {
    pub uffd: Uffd,
    /// The features enabled: all that were needed, and those wanted that
    /// the kernel has.
    pub features: u64,
}

/// What a failed install call asks of its caller: the retry rules every
/// client follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// `EAGAIN`: events wait (a discard, unmap, move or fork is in
    /// progress); read them, then decide again: the target may have moved
    /// or gone.
    ReadEvents,
    /// `ENOMEM`: the kernel was short of memory for the page or a page
    /// table; wait and try again, as a fault would. Giving up would leave
    /// the page to read zeros.
    Retry,
    /// `EEXIST`: something is there already (someone else installed it);
    /// its waiters need a wake.
    Exists,
    /// Anything else: the call cannot work there; the caller judges.
    Fails,
}

/// The rule for an install call that failed with `e`.
pub fn after(e: &io::Error) -> After {
    match errno(e) {
        libc::EAGAIN => After::ReadEvents,
        libc::ENOMEM => After::Retry,
        libc::EEXIST => After::Exists,
        _ => After::Fails,
    }
}

/// Runs an install (`attempt`) until it succeeds or fails for a reason
/// other than [`After::ReadEvents`] and [`After::Retry`]: `read_events`
/// runs on the first, a sleep of `enomem_wait` on the second, then it
/// tries again. `attempt` returns `None` to stop (what it would install
/// is no longer owed, e.g. an event read meanwhile dropped it).
///
/// Both closures are handed `state`, which they may both need (what is
/// owed, the events' edits to it).
pub fn retrying<S: ?Sized>(
    state: &mut S,
    enomem_wait: Duration,
    mut attempt: impl FnMut(&mut S) -> Option<Result<usize, Partial>>,
    mut read_events: impl FnMut(&mut S),
) -> Option<Result<usize, Partial>> {
    loop {
        let p = match attempt(state)? {
            Ok(n) => return Some(Ok(n)),
            Err(p) => p,
        };
        match after(&p.error) {
            After::ReadEvents => read_events(state),
            After::Retry => std::thread::sleep(enomem_wait),
            After::Exists | After::Fails => return Some(Err(p)),
        }
    }
}

/// One message read from a userfaultfd.
#[derive(Debug)]
#[allow(missing_docs)] // each variant's fields are named in its doc
pub enum Msg {
    /// A thread waits on a fault at `addr`; it is woken by a fill or
    /// unregistration. (Relocation needs no address: the install or
    /// unregistration wakes every waiter; the lazy fill serves it.)
    Fault { addr: usize },
    /// The process forked; the child's registered ranges now belong to
    /// this new descriptor.
    Fork(Uffd),
    /// `[from, from + len)` was moved to `to` by mremap.
    Remap { from: usize, to: usize, len: usize },
    /// `[start, end)` is about to be zapped (MADV_DONTNEED, MADV_FREE,
    /// MADV_REMOVE); the zap happens after this message is read.
    Remove { start: usize, end: usize },
    /// `[start, end)` was unmapped.
    Unmap { start: usize, end: usize },
}

/// Errors of a move or copy, with the bytes done before it.
#[derive(Debug)]
pub struct Partial {
    pub done: usize,
    pub error: io::Error,
}

/// A userfaultfd descriptor (closing it unregisters everything it holds
/// and wakes every thread waiting on it).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

impl AsFd for Uffd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is the exact uAPI struct for `req` (sizes are part of
    // the request number) and lives for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The outcome of a ranged ioctl of `len` bytes whose struct reports the
/// bytes done in `done` (or a negative errno, none done) when it fails.
fn partial(res: io::Result<()>, done: i64, len: usize) -> Result<usize, Partial> {
    res.map(|()| len).map_err(|error| Partial {
        done: usize::try_from(done).unwrap_or(0).min(len),
        error,
    })
}

fn range(start: usize, len: usize) -> Range {
    Range {
        start: start as u64,
        len: len as u64,
    }
}

/// Opens a descriptor that catches kernel-mode faults too: through
/// /dev/userfaultfd where we may open it, else the syscall without
/// UFFD_USER_MODE_ONLY (needs CAP_SYS_PTRACE or
/// vm.unprivileged_userfaultfd=1).
fn open_all_faults(flags: libc::c_int) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/userfaultfd");
    let dev_err = match dev {
        Ok(dev) => {
            // SAFETY: USERFAULTFD_IOC_NEW takes the new descriptor's flags
            // by value and returns a descriptor or -1.
            let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
            if fd >= 0 {
                // SAFETY: the kernel just gave us this descriptor.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            io::Error::last_os_error()
        }
        Err(e) => e,
    };
    // SAFETY: the syscall takes flags only; a negative return is an error.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd >= 0 {
        // SAFETY: the kernel just gave us this descriptor.
        return Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) });
    }
    let sys_err = io::Error::last_os_error();
    Err(io::Error::new(
        sys_err.kind(),
        format!("/dev/userfaultfd: {dev_err}; userfaultfd(2): {sys_err}"),
    ))
}

/// The features in a userfaultfd's fdinfo (`API:\t<api>:<features>:<ioctls>`,
/// hexadecimal), less the kernel's own "initialised" bit (1 << 31);
/// `None` where the line is missing or names another API.
fn parse_fdinfo_features(info: &str) -> Option<u64> {
    let api = info.lines().find_map(|l| l.strip_prefix("API:"))?;
    let mut parts = api.trim().split(':');
    let version = u64::from_str_radix(parts.next()?, 16).ok()?;
    let features = u64::from_str_radix(parts.next()?, 16).ok()?;
    (version == UFFD_API).then_some(features & !(1 << 31))
}

impl Uffd {
    /// Opens a userfaultfd and enables `features`. With `user_mode_ok`, a
    /// user-mode-only descriptor is accepted when no other can be had.
    /// Returns the descriptor and what it can catch.
    pub fn open(features: u64, user_mode_ok: bool) -> io::Result<(Uffd, Reach)> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let (fd, reach) = match open_all_faults(flags) {
            Ok(fd) => (fd, Reach::AllFaults),
            Err(e) if !user_mode_ok => return Err(e),
            Err(_) => {
                // SAFETY: as above.
                let fd =
                    unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: the kernel just gave us this descriptor.
                let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
                (fd, Reach::UserModeOnly)
            }
        };
        let mut api = Api {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        ioctl(&fd, UFFDIO_API, &mut api)?;
        Ok((Uffd { fd }, reach))
    }

    /// The features this kernel offers (a throwaway user-mode descriptor
    /// asked with none requested), or why none can be had.
    pub fn supported_features() -> io::Result<u64> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: as above.
        let mut fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
        if fd < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            // Kernels before 5.11 do not know UFFD_USER_MODE_ONLY.
            // SAFETY: as above.
            fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        }
        let fd = if fd >= 0 {
            // SAFETY: the kernel just gave us this descriptor.
            unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) }
        } else {
            open_all_faults(flags)?
        };
        let mut api = Api {
            api: UFFD_API,
            features: 0,
            ioctls: 0,
        };
        ioctl(&fd, UFFDIO_API, &mut api)?;
        Ok(api.features)
    }

    /// Opens a descriptor with every feature in `need` and those of `want`
    /// the kernel has; with `user_mode_ok`, a user-mode-only one is taken
    /// where no other can be had. Refuses naming what is missing.
    pub fn open_for(need: u64, want: u64, user_mode_ok: bool) -> Result<Opened, UffdRefusal> {
        let supported = Uffd::supported_features().map_err(UffdRefusal::NoUffd)?;
        if let Some(why) = lacking(supported, need, FEATURE_NAMES) {
            return Err(why);
        }
        let features = need | want & supported;
        match Uffd::open(features, user_mode_ok) {
            Ok((uffd, _)) => Ok(Opened { uffd, features }),
            Err(e) => Err(Uffd::why_not(e, features, user_mode_ok)),
        }
    }

    /// Why opening with `features` failed with `e`: a descriptor opened
    /// without any tells a missing one from a user-mode-only one from
    /// forbidden fork events.
    fn why_not(e: io::Error, features: u64, user_mode_ok: bool) -> UffdRefusal {
        let forbidden = |e: io::Error| {
            if errno(&e) == libc::EPERM && features & FEATURE_EVENT_FORK != 0 {
                UffdRefusal::NoForkEvents(e)
            } else {
                UffdRefusal::NoUffd(e)
            }
        };
        match Uffd::open(0, false) {
            Ok(_) => forbidden(e),
            Err(full) => match Uffd::open(0, true) {
                Ok(_) if !user_mode_ok => UffdRefusal::UserModeOnly(full),
                Ok(_) => forbidden(e),
                Err(_) => UffdRefusal::NoUffd(full),
            },
        }
    }

    /// Registers `[start, start + len)` in missing mode: a thread touching
    /// an empty entry there waits until it is filled or woken. Returns the
    /// mask of ioctls the range supports.
    pub fn register_missing(&self, start: usize, len: usize) -> io::Result<u64> {
        self.register(start, len, REGISTER_MODE_MISSING)
    }

    /// Registers the range in write-protect mode only: the range belongs
    /// to this descriptor (a `UFFDIO_MOVE` may land there), yet a fault in
    /// it is the kernel's to serve, as in any mapping: nothing is write
    /// protected until `UFFDIO_WRITEPROTECT` says so.
    pub fn register_wp(&self, start: usize, len: usize) -> io::Result<u64> {
        self.register(start, len, REGISTER_MODE_WP)
    }

    fn register(&self, start: usize, len: usize, mode: u64) -> io::Result<u64> {
        let mut r = Register {
            range: range(start, len),
            mode,
            ioctls: 0,
        };
        ioctl(&self.fd, UFFDIO_REGISTER, &mut r)?;
        Ok(r.ioctls)
    }

    /// Unregisters the range (only VMAs registered through this descriptor;
    /// the kernel refuses anything registered by another) and wakes every
    /// thread waiting in it.
    pub fn unregister(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = range(start, len);
        ioctl(&self.fd, UFFDIO_UNREGISTER, &mut r)
    }

    fn transfer(&self, req: u64, dst: usize, src: usize, len: usize) -> Result<usize, Partial> {
        let mut t = Transfer {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: 0,
            result: 0,
        };
        let res = ioctl(&self.fd, req, &mut t);
        partial(res, t.result, len)
    }

    /// `UFFDIO_MOVE`: moves the pages of `[src, src + len)` to `dst`, which
    /// must be registered with this descriptor and empty. Refused (EAGAIN)
    /// while an event is unread, so a move never lands in a range whose
    /// change we have not seen; refused (EBUSY) for pages pinned for DMA or
    /// shared with another process.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize) -> Result<usize, Partial> {
        self.transfer(UFFDIO_MOVE, dst, src, len)
    }

    /// `UFFDIO_COPY`: copies `[src, src + len)` into new pages at `dst`
    /// (registered, empty) and wakes its waiters.
    pub fn copy(&self, dst: usize, src: usize, len: usize) -> Result<usize, Partial> {
        self.transfer(UFFDIO_COPY, dst, src, len)
    }

    /// `UFFDIO_POISON`: installs poison markers over `[dst, dst + len)`
    /// (registered, empty): a touch there gets SIGBUS `BUS_MCEERR_AR`, as
    /// real poison would; wakes its waiters. Linux 6.6+.
    pub fn poison(&self, dst: usize, len: usize) -> Result<usize, Partial> {
        self.range_mode(UFFDIO_POISON, dst, len)
    }

    /// A ranged install whose struct is a range, a mode and the bytes
    /// done (`uffdio_poison`, `uffdio_zeropage`).
    fn range_mode(&self, req: u64, dst: usize, len: usize) -> Result<usize, Partial> {
        let mut p = Poison {
            range: range(dst, len),
            mode: 0,
            updated: 0,
        };
        let res = ioctl(&self.fd, req, &mut p);
        partial(res, p.updated, len)
    }

    /// `UFFDIO_ZEROPAGE`: maps the shared zero page over `[dst, dst + len)`
    /// (registered, empty; anonymous memory, or a zeroed page of shmem):
    /// reads give zeros without a page of memory being used, and a write
    /// later gets its own page, as after a read fault. hugetlb ranges are
    /// not offered it (`-EINVAL`). Wakes its waiters. Fails as a copy
    /// does, with the same retry rules ([`after`]).
    pub fn zeropage(&self, dst: usize, len: usize) -> Result<usize, Partial> {
        // `struct uffdio_zeropage` has `struct uffdio_poison`'s layout.
        const UFFDIO_ZEROPAGE: u64 = ioc(RW, 0x04, std::mem::size_of::<Poison>());
        self.range_mode(UFFDIO_ZEROPAGE, dst, len)
    }

    /// `UFFDIO_WAKE`: wakes the threads waiting on `[start, start + len)`
    /// (they retry their fault).
    pub fn wake(&self, start: usize, len: usize) -> io::Result<()> {
        let mut r = range(start, len);
        ioctl(&self.fd, UFFDIO_WAKE, &mut r)
    }

    /// Reads every waiting message and hands each to `each`, allocating
    /// nothing itself (never blocks): for a thread that must read a fork's
    /// event while another thread inside fork() holds the allocator's
    /// locks. Returns how many were read.
    pub fn read_each(&self, mut each: impl FnMut(Msg)) -> io::Result<usize> {
        const AT_ONCE: usize = 16;
        let mut n_read = 0;
        loop {
            let mut buf = [RawMsg::default(); AT_ONCE];
            // SAFETY: the buffer is valid for AT_ONCE whole messages; the
            // kernel writes whole messages into it.
            let n = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    std::mem::size_of_val(&buf),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.raw_os_error() {
                    Some(libc::EAGAIN) => Ok(n_read),
                    Some(libc::EINTR) => continue,
                    _ => Err(e),
                };
            }
            let count = n as usize / std::mem::size_of::<RawMsg>();
            for msg in buf[..count].iter().filter_map(Self::decode) {
                each(msg);
                n_read += 1;
            }
            if count < AT_ONCE {
                return Ok(n_read);
            }
        }
    }

    /// Waits up to `timeout_ms` (-1: forever) for a message; `true` if one
    /// is there.
    pub fn poll(&self, timeout_ms: i32) -> bool {
        let d = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let [m] = readable([self.fd.as_raw_fd()], d);
        m
    }

    /// Waits up to `d` for a message (finer than [`Uffd::poll`]); `true`
    /// if one is there.
    pub fn poll_for(&self, d: Duration) -> bool {
        let [m] = readable([self.fd.as_raw_fd()], Some(d));
        m
    }

    /// A userfaultfd another process made, initialised and registered (a
    /// VMM's, received over a socket), and the features its maker enabled
    /// (read from `/proc/self/fdinfo`; the API call that set them can be
    /// made once only). Made non-blocking (the flag is the open file's, so
    /// its maker's reads stop blocking too; a VMM that hands its descriptor
    /// over reads none): this side polls before it reads, and the kernel
    /// answers poll on a blocking descriptor with an error. Refuses a
    /// descriptor that is no userfaultfd, or one not initialised.
    pub fn adopt(fd: OwnedFd) -> io::Result<(Uffd, u64)> {
        let raw = fd.as_raw_fd();
        let what = std::fs::read_link(format!("/proc/self/fd/{raw}"))?;
        if what.to_str() != Some("anon_inode:[userfaultfd]") {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the descriptor is {}, not a userfaultfd", what.display()),
            ));
        }
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}"))?;
        let features = parse_fdinfo_features(&info).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "the userfaultfd's fdinfo names no API this library knows",
            )
        })?;
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory passed.
        unsafe {
            let fl = libc::fcntl(raw, libc::F_GETFL);
            if fl < 0 || libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        // Non-blocking now, a descriptor polls in error only while no
        // UFFDIO_API call was made on it (every install would fail).
        let mut p = libc::pollfd {
            fd: raw,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) };
        if p.revents & libc::POLLERR != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the userfaultfd is not initialised (its maker made no UFFDIO_API call)",
            ));
        }
        Ok((Uffd { fd }, features))
    }

    /// The descriptor, to poll beside others.
    pub(crate) fn raw(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    /// A second descriptor of the same userfaultfd, for another thread to
    /// poll (never to read: messages are the owner's).
    pub(crate) fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Waits until a message is there or `other` is readable; whether a
    /// message is.
    pub(crate) fn poll_or(&self, other: &impl AsRawFd) -> bool {
        let [m, _] = readable([self.fd.as_raw_fd(), other.as_raw_fd()], None);
        m
    }

    /// Every message waiting now (never blocks). Reading an event is what
    /// lets the thread that caused it continue.
    pub fn read_all(&self) -> io::Result<Vec<Msg>> {
        let mut out = Vec::new();
        self.read_each(|m| out.push(m))?;
        Ok(out)
    }

    fn decode(m: &RawMsg) -> Option<Msg> {
        let [a, b, c] = m.arg;
        Some(match m.event {
            EVENT_PAGEFAULT => Msg::Fault { addr: b as usize },
            EVENT_FORK => {
                // SAFETY: the kernel installed this descriptor in our table
                // for us when the message was read; nobody else owns it.
                let fd = unsafe { OwnedFd::from_raw_fd(a as u32 as libc::c_int) };
                Msg::Fork(Uffd { fd })
            }
            EVENT_REMAP => Msg::Remap {
                from: a as usize,
                to: b as usize,
                len: c as usize,
            },
            EVENT_REMOVE => Msg::Remove {
                start: a as usize,
                end: b as usize,
            },
            EVENT_UNMAP => Msg::Unmap {
                start: a as usize,
                end: b as usize,
            },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_uapi() {
        // Values printed by a C program including <linux/userfaultfd.h>.
        assert_eq!(UFFDIO_API, 0xc018aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010aa01);
        assert_eq!(UFFDIO_COPY, 0xc028aa03);
        assert_eq!(UFFDIO_MOVE, 0xc028aa05);
        assert_eq!(UFFDIO_WAKE, 0x8010aa02);
        assert_eq!(UFFDIO_POISON, 0xc020aa08);
        assert_eq!(std::mem::size_of::<RawMsg>(), 32);
    }

    #[test]
    fn what_is_missing_is_named_first_in_table_order() {
        let all = FEATURE_EVENT_FORK | FEATURE_EVENT_REMAP | FEATURE_EVENT_REMOVE;
        let why = lacking(all, all | FEATURE_EVENT_UNMAP | FEATURE_MOVE, FEATURE_NAMES);
        assert!(matches!(
            why,
            Some(UffdRefusal::KernelLacks {
                feature: "userfaultfd UNMAP events",
                since: "4.11"
            })
        ));
        assert!(lacking(all, all, FEATURE_NAMES).is_none());
        assert!(require_ioctls(IOCTL_COPY | IOCTL_MOVE, IOCTL_COPY | IOCTL_MOVE).is_ok());
        assert!(matches!(
            require_ioctls(IOCTL_COPY, IOCTL_COPY | IOCTL_MOVE),
            Err(UffdRefusal::KernelLacks {
                feature: "UFFDIO_MOVE on this mapping",
                ..
            })
        ));
    }

    fn failed(errno: i32) -> Result<usize, Partial> {
        Err(Partial {
            done: 0,
            error: io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn installs_retry_after_events_and_enomem_and_stop_on_anything_else() {
        let mut answers = vec![failed(libc::EAGAIN), failed(libc::ENOMEM), Ok(4096)];
        answers.reverse();
        let mut reads = 0;
        let r = retrying(&mut reads, Duration::ZERO, |_| answers.pop(), |r| *r += 1);
        assert!(matches!(r, Some(Ok(4096))));
        assert_eq!(reads, 1);
        let mut answers = vec![failed(libc::EEXIST)];
        let r = retrying(&mut (), Duration::ZERO, |_| answers.pop(), |_| {});
        assert!(matches!(r, Some(Err(p)) if after(&p.error) == After::Exists));
        let mut n = 0;
        let r = retrying(
            &mut n,
            Duration::ZERO,
            |n| {
                *n += 1;
                (*n < 3).then(|| failed(libc::EAGAIN))
            },
            |_| {},
        );
        assert!(r.is_none(), "the caller stopped it");
        assert_eq!(
            after(&io::Error::from_raw_os_error(libc::ENOENT)),
            After::Fails
        );
    }

    #[test]
    fn fdinfo_features_are_read_without_the_initialised_bit() {
        let info = "pos:\t0\nflags:\t02004000\npending:\t0\ntotal:\t0\nAPI:\taa:80000008:1f800000000000ff\n";
        assert_eq!(parse_fdinfo_features(info), Some(FEATURE_EVENT_REMOVE));
        assert_eq!(parse_fdinfo_features("API:\tab:8:0\n"), None, "another API");
        assert_eq!(parse_fdinfo_features("pending:\t0\n"), None);
    }

    #[test]
    fn an_adopted_descriptor_names_its_features_and_anything_else_is_refused() {
        let Ok((u, _)) = Uffd::open(FEATURE_EVENT_REMOVE, true) else {
            eprintln!("SKIP: no userfaultfd here");
            return;
        };
        let (_, features) = Uffd::adopt(u.fd).expect("our own userfaultfd");
        assert_eq!(features, FEATURE_EVENT_REMOVE);
        let f = std::fs::File::open("/proc/self/stat").expect("a file");
        let e = Uffd::adopt(OwnedFd::from(f)).expect_err("a file is no userfaultfd");
        assert!(e.to_string().contains("not a userfaultfd"), "{e}");
    }
}
