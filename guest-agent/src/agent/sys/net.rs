//! Interface configuration through `ioctl` on an `AF_INET` datagram socket: what the agent
//! needs to bring up the loopback interface (there is no other); and a listener's backlog.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::check;

/// A close-on-exec `AF_INET` datagram socket, the handle interface `ioctl`s go through.
pub fn inet_socket() -> std::io::Result<OwnedFd> {
    // SAFETY: socket(2) takes plain integers.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a fresh socket that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `listen(2)` again on a listening socket: sets its accept backlog to `backlog`.
pub fn set_backlog(sock: BorrowedFd<'_>, backlog: i32) -> std::io::Result<()> {
    // SAFETY: listen(2) takes a descriptor and an integer; `sock` is open.
    check(unsafe { libc::listen(sock.as_raw_fd(), backlog) })?;
    Ok(())
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *d = s as libc::c_char;
    }
    r
}

fn sockaddr_in(addr: [u8; 4]) -> libc::sockaddr {
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sockaddr_in and sockaddr have the same size and both are plain data; the
    // kernel reads it back as a sockaddr_in (sin_family says so).
    unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
}

fn ioctl(sock: BorrowedFd<'_>, req: libc::c_ulong, r: &mut libc::ifreq) -> std::io::Result<()> {
    // SAFETY: sock is an open socket and `r` a valid ifreq, which the interface requests
    // below read (and may write) and which outlives the call.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), req as _, r as *mut libc::ifreq) })?;
    Ok(())
}

/// Set interface `name`'s IPv4 address (`SIOCSIFADDR`).
pub fn set_if_addr(sock: BorrowedFd<'_>, name: &str, addr: [u8; 4]) -> std::io::Result<()> {
    let mut r = ifreq(name);
    r.ifr_ifru.ifru_addr = sockaddr_in(addr);
    ioctl(sock, libc::SIOCSIFADDR, &mut r)
}

/// Set interface `name`'s IPv4 netmask (`SIOCSIFNETMASK`).
pub fn set_if_netmask(sock: BorrowedFd<'_>, name: &str, mask: [u8; 4]) -> std::io::Result<()> {
    let mut r = ifreq(name);
    r.ifr_ifru.ifru_netmask = sockaddr_in(mask);
    ioctl(sock, libc::SIOCSIFNETMASK, &mut r)
}

/// Mark interface `name` up and running (`SIOCSIFFLAGS`).
pub fn set_if_up(sock: BorrowedFd<'_>, name: &str) -> std::io::Result<()> {
    let mut r = ifreq(name);
    r.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(sock, libc::SIOCSIFFLAGS, &mut r)
}
