//! `ListeningPorts`: the TCP ports something in the guest listens on at every address
//! (`0.0.0.0`), from the kernel's `/proc/net/tcp`, read bounded. A pod's runtime forwards
//! them from the pod's network namespace, as any runtime's pod IP would reach them; a port
//! listening on loopback only stays the guest's own.

use std::io::Read;

use vm_agent_protocol::protocol::MAX_LISTENING_PORTS as MAX_PORTS;

/// Most bytes of `/proc/net/tcp` read (about 6000 sockets).
pub const MAX_TABLE_BYTES: u64 = 1 << 20;
/// The `st` of a listening socket.
const TCP_LISTEN: &str = "0A";

/// The ports of the listening sockets bound to every address in `table` (the text of
/// `/proc/net/tcp`), sorted, each once, at most [`MAX_PORTS`]. A malformed line is skipped.
pub fn parse(table: &str) -> Vec<u16> {
    let mut ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_slot, local, _remote, state) = (
                fields.next()?,
                fields.next()?,
                fields.next()?,
                fields.next()?,
            );
            let (addr, port) = local.split_once(':')?;
            let any = addr.len() == 8 && addr.bytes().all(|b| b == b'0');
            (state == TCP_LISTEN && any)
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .filter(|p| *p != 0)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports.truncate(MAX_PORTS);
    ports
}

/// The guest's listening ports ([`parse`] of its `/proc/net/tcp`).
pub fn read() -> std::io::Result<Vec<u16>> {
    let mut text = String::new();
    std::fs::File::open("/proc/net/tcp")?
        .take(MAX_TABLE_BYTES)
        .read_to_string(&mut text)?;
    Ok(parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_on_every_address_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
            \x20  0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
            \x20  1: 0100007F:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n\
            \x20  2: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1\n\
            \x20  3: 0100007F:1F90 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 4 1\n\
            \x20  4: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5 1\n\
            garbage\n\
            \x20  5: 00000000:ZZZZ 00000000:0000 0A\n";
        assert_eq!(
            parse(table),
            [80, 8080],
            "sorted, once each; loopback-only skipped"
        );
        assert!(parse("").is_empty());
    }

    #[test]
    fn this_hosts_table_parses() {
        // Whatever listens here, the real file's shape is understood.
        let ports = read().unwrap();
        assert!(ports.len() <= MAX_PORTS);
    }
}
