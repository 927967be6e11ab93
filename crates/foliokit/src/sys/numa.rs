//! NUMA syscalls: bind a range to a node, move pages to a node.

use std::io;

/// move_pages flag: move pages used only by this process (linux/mempolicy.h).
const MPOL_MF_MOVE: libc::c_int = 1 << 1;

/// Binds `[addr, addr + len)` to `node` (MPOL_BIND) before it is faulted.
pub fn mbind(addr: usize, len: usize, node: u32) -> io::Result<()> {
    let bits = 8 * std::mem::size_of::<libc::c_ulong>();
    let mut mask = vec![0 as libc::c_ulong; node as usize / bits + 1];
    mask[node as usize / bits] |= 1 << (node as usize % bits);
    // SAFETY: the mask holds `mask.len() * bits` bits, which is what we
    // pass as maxnode (+1, as the kernel counts it); the range is the
    // caller's own mapping.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            libc::MPOL_BIND,
            mask.as_ptr(),
            mask.len() * bits + 1,
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// move_pages(2) for process `pid` (0: this one): pages are addresses in
/// that process; moves only pages mapped by it alone (`MPOL_MF_MOVE`).
pub fn move_pages_of(
    pid: libc::pid_t,
    pages: &[usize],
    node: u32,
    status: &mut [i32],
) -> io::Result<()> {
    assert_eq!(pages.len(), status.len());
    let nodes = vec![node as libc::c_int; pages.len()];
    // SAFETY: three arrays of `pages.len()` entries each.
    unsafe { move_pages_raw(pid, pages, nodes.as_ptr(), status, MPOL_MF_MOVE) }
}

/// The `move_pages(2)` call itself.
///
/// # Safety
/// `nodes` is null (a query) or points to `pages.len()` node numbers;
/// `pages.len() == status.len()`.
unsafe fn move_pages_raw(
    pid: libc::pid_t,
    pages: &[usize],
    nodes: *const libc::c_int,
    status: &mut [i32],
    flags: libc::c_int,
) -> io::Result<()> {
    // SAFETY: pages and status hold `pages.len()` entries, nodes is null or
    // as many (caller's contract); pid 0 is this process.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            pid,
            pages.len(),
            pages.as_ptr(),
            nodes,
            status.as_mut_ptr(),
            flags,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Which NUMA node each page is on now: `status[i]` becomes the node of
/// the page holding address `pages[i]`, or a negative errno for that page
/// (`-ENOENT`: not faulted in, or the zero page; `-EFAULT`: not mapped).
/// Moves nothing (`move_pages(2)` with no target nodes), so it is safe on
/// any address; a tiering agent uses it to see where memory landed.
///
/// `Err` only when the query as a whole fails (e.g. `ENOSYS` on a kernel
/// without NUMA support).
///
/// # Panics
/// If `pages` and `status` differ in length.
///
/// ```
/// let buf = vec![1u8; 4096];
/// let mut status = [0i32; 1];
/// foliokit::migrate::page_nodes(&[buf.as_ptr() as usize], &mut status)?;
/// assert!(status[0] >= 0, "a written page is on some node");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn page_nodes(pages: &[usize], status: &mut [i32]) -> io::Result<()> {
    page_nodes_of(0, pages, status)
}

/// The node of each page of process `pid` (0: this one), or a negative
/// errno (`-ENOENT`: not present, `-EFAULT`: not mapped).
pub fn page_nodes_of(pid: libc::pid_t, pages: &[usize], status: &mut [i32]) -> io::Result<()> {
    assert_eq!(pages.len(), status.len());
    // SAFETY: equal lengths (asserted); a null node array asks for the
    // current node of each page.
    unsafe { move_pages_raw(pid, pages, std::ptr::null(), status, 0) }
}

/// Nodes a [`NodeMask`] can name: the kernel's largest `MAX_NUMNODES`.
const NODEMASK_BITS: usize = 1024;

/// A node mask as `get_mempolicy`/`set_mempolicy` take it.
pub type NodeMask = [libc::c_ulong; NODEMASK_BITS / libc::c_ulong::BITS as usize];

/// The calling thread's memory policy: its mode (with the mode flags
/// `MPOL_F_STATIC_NODES`, `MPOL_F_RELATIVE_NODES`... ORed in, as the kernel
/// reports it) and its nodes. `Ok(None)` on a kernel without NUMA
/// (`ENOSYS`): there is no policy to follow.
pub fn get_mempolicy() -> io::Result<Option<(libc::c_int, NodeMask)>> {
    let mut mode: libc::c_int = 0;
    let mut mask: NodeMask = [0; NODEMASK_BITS / libc::c_ulong::BITS as usize];
    // SAFETY: `mode` and `mask` are ours; maxnode is the mask's size in
    // bits, which the kernel fills at most (no address, no flags: the
    // thread's own policy).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut mode as *mut libc::c_int,
            mask.as_mut_ptr(),
            NODEMASK_BITS,
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc == 0 {
        return Ok(Some((mode, mask)));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOSYS) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Sets the calling thread's memory policy to what [`get_mempolicy`]
/// returned (for this or another thread of the process).
pub fn set_mempolicy(mode: libc::c_int, mask: &NodeMask) -> io::Result<()> {
    // SAFETY: the mask is `NODEMASK_BITS` bits; maxnode is one more, as the
    // kernel counts it (it reads maxnode - 1 bits).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            mode,
            mask.as_ptr(),
            NODEMASK_BITS + 1,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}
