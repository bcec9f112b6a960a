//! The secure channel ([`ferry_channel`]) as the engine's packet transport.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::{PacketSink, PacketSource};
use ferry_channel::blocking::{SecureReader, SecureWriter};
use ferry_channel::ChannelError;

/// The sending half of an established channel (over TCP unless said otherwise).
pub struct ChannelSink<W: Write = TcpStream>(pub SecureWriter<W>);

/// The receiving half of an established channel (over TCP unless said otherwise).
pub struct ChannelSource<R: Read = TcpStream>(pub SecureReader<R>);

impl<W: Write> PacketSink for ChannelSink<W> {
    fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        self.0.send(payload).map_err(ChannelError::into_io)
    }

    fn payload_buf(&mut self, len: usize) -> &mut [u8] {
        // The engine never asks for more than the negotiated packet size (SendOptions::max_packet).
        self.0
            .payload_buf(len)
            .expect("engine packets fit the channel's maximum")
    }

    fn send_payload_buf(&mut self, len: usize) -> io::Result<()> {
        self.0.send_payload_buf(len).map_err(ChannelError::into_io)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(ChannelError::into_io)
    }

    fn packet_limit(&self, max: usize) -> usize {
        self.0.packet_limit().min(max)
    }
}

impl<R: Read> PacketSource for ChannelSource<R> {
    fn recv(&mut self) -> io::Result<Option<&mut [u8]>> {
        self.0.recv().map_err(ChannelError::into_io)
    }
}
