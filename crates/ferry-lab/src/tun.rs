//! Layer-3 tun devices: the two ends of an emulated link.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;

use crate::netns::Netns;
use crate::LabError;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags (a `short`) at the start of the
/// 24-byte union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates the tun device `name` inside `ns` and returns its queue: each read is one IP packet the
/// namespace sent out of the device, each write one IP packet it receives. Non-blocking.
///
/// The device belongs to the namespace the opening thread is in, so it never exists in this
/// process's own namespace. Without `IFF_VNET_HDR` the device offers no offloads, so the kernel
/// segments (GSO) before the queue: every packet is at most the device's MTU, as on a real wire.
pub(crate) fn open_in(ns: &Netns, name: &str) -> Result<File, LabError> {
    let fail = |e: io::Error| LabError::Tun(name.to_string(), ns.name(), e);
    let file = ns
        .enter(|| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open("/dev/net/tun")
        })
        .map_err(fail)?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    assert!(
        name.len() < libc::IFNAMSIZ,
        "interface name {name:?} too long"
    );
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads (and writes back the name into) a `struct ifreq`, which `IfReq` lays
    // out (40 bytes, C layout); `req` lives across the call and `file` is an open tun descriptor.
    // std and the workspace's crates have no safe wrapper for this ioctl.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    if rc != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok(file)
}
