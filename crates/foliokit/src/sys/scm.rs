//! Unix-socket plumbing: a descriptor passed with a message
//! (`SCM_RIGHTS`), the peer's pid (`SO_PEERCRED`), and a pidfd.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Room for one descriptor's control message.
const CMSG_ROOM: usize = 64;

/// Sends `bytes` with `fd` attached, in one `sendmsg`; returns the bytes
/// sent (a stream socket may take fewer: the caller sends the rest plain).
pub(crate) fn send_with_fd(sock: RawFd, bytes: &[u8], fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    let mut control = [0u64; CMSG_ROOM / 8];
    // SAFETY: msghdr is plain data; all zeros is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as _;
    // SAFETY: the control buffer is 8-byte aligned and CMSG_SPACE(int)
    // bytes long at least, so CMSG_FIRSTHDR is non-null and its data holds
    // one int.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: msg points at live buffers for the call's duration.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives into `buf` with one `recvmsg`, taking every descriptor passed
/// with it (close-on-exec). Returns the bytes read (0: the peer closed)
/// and the descriptors; a truncated control message is an error, and the
/// descriptors that did arrive are closed.
pub(crate) fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; CMSG_ROOM / 8];
    // SAFETY: msghdr is plain data; all zeros is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = CMSG_ROOM as _;
    let n = loop {
        // SAFETY: msg points at live buffers for the call's duration.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into our
    // buffer with the libc macros; each SCM_RIGHTS payload is ints, each
    // a descriptor now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors were passed than one message may carry",
        ));
    }
    Ok((n, fds))
}

/// The pid of the process at the other end of a connected Unix socket.
pub(crate) fn peer_pid(sock: RawFd) -> io::Result<i32> {
    // SAFETY: ucred is plain integers; all zeros is valid.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes one ucred into the buffer we size.
    let rc = unsafe {
        libc::getsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cred.pid)
}

/// A pidfd of `pid` (Linux 5.3): readable once that process has exited.
pub(crate) fn pidfd(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: the syscall takes a pid and flags; a negative return is an
    // error.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just gave us this descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_descriptor_and_its_bytes_arrive_together() {
        let (a, b) = UnixStream::pair().expect("a socket pair");
        let f = std::fs::File::open("/proc/self/stat").expect("a file");
        assert_eq!(
            send_with_fd(a.as_raw_fd(), b"hello", f.as_fd()).expect("sent"),
            5
        );
        let mut buf = [0u8; 16];
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).expect("received");
        assert_eq!(&buf[..n], b"hello");
        assert_eq!(fds.len(), 1);
        assert_eq!(
            peer_pid(b.as_raw_fd()).expect("peer"),
            std::process::id() as i32
        );
        drop(a);
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf).expect("end of stream");
        assert_eq!((n, fds.len()), (0, 0));
    }

    #[test]
    fn a_pidfd_is_readable_once_its_process_has_exited() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("a child");
        let fd = pidfd(child.id() as i32).expect("a pidfd");
        let ready = |ms| {
            crate::sys::poll::readable([fd.as_raw_fd()], Some(std::time::Duration::from_millis(ms)))
                [0]
        };
        assert!(!ready(0), "running");
        child.wait().expect("reaped");
        assert!(ready(1000), "exited");
    }
}
