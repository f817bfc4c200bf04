//! Host clients that flood the device with connections (issue 39): at the cap the oldest
//! connection the guest has not answered on makes room for a newcomer, and new connections'
//! `REQUEST`s cannot hold back the traffic of connections already made.

use std::io::Read;

use vm_memory::{Bytes, GuestAddress};

use super::props::{Op, RX_BUFS, RX_USED, guest, run_capped};
use super::*;

fn connect() -> Op {
    Op::HostConnect(b"CONNECT 1024\n".to_vec())
}

/// A client that sends its first bytes with its `CONNECT` line, as the agent client does.
fn connect_eager() -> Op {
    Op::HostConnect(b"CONNECT 1024\nhello".to_vec())
}

/// The headers of the first `n` packets the guest got in its RX buffers.
fn rx_headers(ran: &super::props::Ran, n: u64) -> Vec<Header> {
    (0..n)
        .map(|i| {
            let mut hb = [0u8; HDR_SIZE];
            ran.mem
                .read_slice(&mut hb, GuestAddress(RX_BUFS + 0x1000 * i))
                .unwrap();
            Header::parse(&hb).unwrap()
        })
        .collect()
}

/// The `(op, src_port)` of the first `n` packets the guest got in its RX buffers.
fn rx_packets(ran: &super::props::Ran, n: u64) -> Vec<(u16, u32)> {
    let headers = rx_headers(ran, n);
    headers.iter().map(|h| (h.op, h.src_port)).collect()
}

/// What a host client received: its bytes and whether the device closed it (end of file, or
/// a reset: a client closed before its line was read).
fn received(s: &mut std::os::unix::net::UnixStream) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let text = |got: &[u8]| String::from_utf8_lossy(got).into_owned();
        match s.read(&mut buf) {
            Ok(0) => return (text(&got), true),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (text(&got), e.kind() == std::io::ErrorKind::ConnectionReset),
        }
    }
}

#[test]
fn at_the_cap_the_oldest_connection_the_guest_never_answered_makes_room() {
    let port = |i: u32| FIRST_HOST_PORT + i;
    let ops = vec![
        // A and B: accepted by the guest, which has sent nothing on them since (B's host
        // client did: that does not count). C: accepted, and the guest answered on it.
        connect(),
        guest(1024, port(0), op::RESPONSE, b""),
        connect(),
        guest(1024, port(1), op::RESPONSE, b""),
        Op::HostWrite(1, 3),
        connect(),
        guest(1024, port(2), op::RESPONSE, b""),
        guest(1024, port(2), op::RW, b"hello"),
        // At the cap: D, which sends its first bytes with its line, pushes out A (the
        // oldest silent); its REQUEST goes out.
        connect_eager(),
        Op::GuestRx(4, 4096),
        // E pushes out B; its REQUEST goes out.
        connect_eager(),
        Op::GuestRx(4, 4096),
        // F: nothing is left to push out (the guest answered on C, D and E wait for it).
        connect_eager(),
    ];
    let mut ran = run_capped(3, ops);
    let mut live: Vec<u32> = ran.m.conns.keys().map(|k| k.0).collect();
    live.sort();
    assert_eq!(live, [port(2), port(3), port(4)]);
    for (i, (want, closed)) in [
        (format!("OK {}\n", port(0)), true),
        (format!("OK {}\n", port(1)), true),
        (format!("OK {}\nhello", port(2)), false),
        (String::new(), false),
        (String::new(), false),
        (String::new(), true),
    ]
    .into_iter()
    .enumerate()
    {
        let got = received(&mut ran.clients[i]);
        assert_eq!(got, (want, closed), "client {i}");
    }
    // The guest is told to drop A and B.
    let used: u16 = ran.mem.read_obj(GuestAddress(RX_USED + 2)).unwrap();
    let told: Vec<u32> = rx_packets(&ran, u64::from(used))
        .into_iter()
        .chain(ran.m.rsts.iter().map(|h| (h.op, h.src_port)))
        .filter(|p| p.0 == op::RST)
        .map(|p| p.1)
        .collect();
    assert_eq!(told, [port(0), port(1)]);
}

#[test]
fn new_connections_cannot_hold_back_traffic_of_connections_made() {
    let mut ops = vec![connect(), guest(1024, FIRST_HOST_PORT, op::RESPONSE, b"")];
    // Ten new connections' REQUESTs queue up, then the first client writes (its `Hello`).
    ops.extend((0..10).map(|_| connect()));
    ops.push(Op::HostWrite(0, 2));
    ops.push(Op::GuestRx(2, 4096));
    let ran = run_capped(MAX_CONNECTIONS, ops);
    let headers = rx_headers(&ran, 2);
    let packets: Vec<(u16, u32, u32)> = headers.iter().map(|h| (h.op, h.src_port, h.len)).collect();
    assert!(
        packets.contains(&(op::RW, FIRST_HOST_PORT, 2)),
        "the first client's bytes waited behind new connections: {packets:?}"
    );
    assert!(
        packets.iter().any(|p| p.0 == op::REQUEST),
        "no new connection got a buffer: {packets:?}"
    );
}

#[test]
fn a_client_that_speaks_first_is_not_queued_behind_silent_ones() {
    // Ten silent new connections queued, then one whose client sent its first bytes.
    let mut ops: Vec<Op> = (0..10).map(|_| connect()).collect();
    ops.push(connect_eager());
    ops.push(Op::GuestRx(1, 4096));
    let ran = run_capped(MAX_CONNECTIONS, ops);
    assert_eq!(rx_packets(&ran, 1), [(op::REQUEST, FIRST_HOST_PORT + 10)]);
}

#[test]
fn at_the_cap_silent_clients_push_out_unsent_ones_and_only_eager_ones_accepted_ones() {
    let port = |i: u32| FIRST_HOST_PORT + i;
    let ops = vec![
        connect(),                               // A: the guest accepts it; silent since
        guest(1024, port(0), op::RESPONSE, b""), //
        connect(),                               // B: its REQUEST queued
        connect_eager(),                         // C: queued, its first bytes sent
        connect(),                               // D: at the cap, pushes out B (unsent)
        Op::GuestRx(2, 4096),                    // C's REQUEST goes first, then D's
        connect(),                               // E: silent, only A left: refused
        connect(),                               // F: the same
        connect_eager(),                         // G: speaks at once: pushes out A
        connect(),                               // H: nothing left to push out: refused
    ];
    let mut ran = run_capped(3, ops);
    let mut live: Vec<u32> = ran.m.conns.keys().map(|k| k.0).collect();
    live.sort();
    assert_eq!(live, [port(2), port(3), port(6)]);
    assert_eq!(
        rx_packets(&ran, 2),
        [(op::REQUEST, port(2)), (op::REQUEST, port(3))]
    );
    let closed: Vec<(usize, (String, bool))> = (0..8)
        .map(|i| (i, received(&mut ran.clients[i])))
        .filter(|(_, r)| r.1)
        .collect();
    let silent = (String::new(), true);
    assert_eq!(
        closed,
        [
            (0, (format!("OK {}\n", port(0)), true)),
            (1, silent.clone()),
            (4, silent.clone()),
            (5, silent.clone()),
            (7, silent),
        ]
    );
    // Only A, which the guest knew, is reset there: the silent clients refused cost it nothing.
    let rsts: Vec<u32> = ran.m.rsts.iter().map(|h| h.src_port).collect();
    assert_eq!(rsts, [port(0)]);
}

/// A loaded guest has not answered the flood's `REQUEST`s yet and accepted none: a client
/// that speaks at once still gets in, in the place of the oldest unanswered silent one (the
/// guest told), while a silent newcomer is refused.
#[test]
fn at_the_cap_a_client_that_spoke_first_pushes_out_an_unanswered_silent_one() {
    let port = |i: u32| FIRST_HOST_PORT + i;
    let ops = vec![
        connect(),            // A
        connect(),            // B
        connect(),            // C
        Op::GuestRx(3, 4096), // their REQUESTs go out; the guest answers none yet
        connect(),            // D: silent, nothing it may push out: refused
        connect_eager(),      // E: speaks at once: pushes out A
        Op::GuestRx(1, 4096), // E's REQUEST goes out
        guest(1024, port(4), op::RESPONSE, b""),
    ];
    let mut ran = run_capped(3, ops);
    let mut live: Vec<u32> = ran.m.conns.keys().map(|k| k.0).collect();
    live.sort();
    assert_eq!(live, [port(1), port(2), port(4)]);
    let got: Vec<(String, bool)> = (0..5).map(|i| received(&mut ran.clients[i])).collect();
    assert_eq!(got[0], (String::new(), true), "A");
    assert_eq!(got[3], (String::new(), true), "D");
    assert_eq!(got[4], (format!("OK {}\n", port(4)), false), "E");
    let rsts: Vec<u32> = ran.m.rsts.iter().map(|h| h.src_port).collect();
    let used: u16 = ran.mem.read_obj(GuestAddress(RX_USED + 2)).unwrap();
    let told: Vec<u32> = rx_packets(&ran, u64::from(used))
        .into_iter()
        .filter(|p| p.0 == op::RST)
        .map(|p| p.1)
        .chain(rsts)
        .collect();
    assert_eq!(told, [port(0)], "the guest is told A is gone");
}

/// A and B: connections the guest accepted and has sent nothing on since.
fn two_accepted_silent() -> Vec<Op> {
    vec![
        connect(),
        guest(1024, FIRST_HOST_PORT, op::RESPONSE, b""),
        connect(),
        guest(1024, FIRST_HOST_PORT + 1, op::RESPONSE, b""),
    ]
}

/// A loaded host: the agent client's line and first bytes reach its socket after the device
/// accepted it and before its event comes round; at the cap, a silent newcomer must not take
/// its slot as a silent client's (the exec that failed under issue 39's 5,000-client flood).
#[test]
fn at_the_cap_a_client_whose_line_came_late_is_read_before_it_is_judged() {
    let port = |i: u32| FIRST_HOST_PORT + i;
    let mut ops = two_accepted_silent();
    ops.extend([
        Op::HostConnectLate(b"CONNECT 1024\nhello".to_vec()), // C: accepted before it spoke
        connect(),                                            // D: silent, over the cap
        Op::GuestRx(1, 4096),                                 // the next REQUEST
    ]);
    let mut ran = run_capped(3, ops);
    let got: Vec<(String, bool)> = (0..4).map(|i| received(&mut ran.clients[i])).collect();
    assert_eq!(
        got[2],
        (String::new(), false),
        "C was dropped as a silent client"
    );
    assert_eq!(got[3], (String::new(), true), "D");
    let mut live: Vec<u32> = ran.m.conns.keys().map(|k| k.0).collect();
    live.sort();
    // D took the next port in its handshake; C became a connection after it.
    assert_eq!(live, [port(0), port(1), port(3)]);
    assert_eq!(rx_packets(&ran, 1), [(op::REQUEST, port(3))]);
}

/// The exec that failed under issue 39's 5,000-client flood: the device accepted the agent
/// client between its `connect` and its write (8 attempts in a row, each refused at once, the
/// write finding the socket closed). Accepted at the cap before it spoke, it is held; once its
/// line and first bytes come, it pushes out a silent connection.
#[test]
fn at_the_cap_a_client_accepted_before_it_spoke_is_judged_when_it_speaks() {
    let port = |i: u32| FIRST_HOST_PORT + i;
    let mut ops = two_accepted_silent();
    ops.extend([
        Op::HostConnectLate(b"CONNECT 1024\nhello".to_vec()), // C: accepted before it spoke
        connect(),            // D: silent, over the cap: refused; then C's event
        Op::GuestRx(2, 4096), // the guest is told A is gone; C's REQUEST
    ]);
    let mut ran = run_capped(2, ops);
    let got: Vec<(String, bool)> = (0..4).map(|i| received(&mut ran.clients[i])).collect();
    assert_eq!(
        got[2],
        (String::new(), false),
        "C was refused before it spoke"
    );
    assert_eq!(got[0], (format!("OK {}\n", port(0)), true), "A");
    assert_eq!(got[3], (String::new(), true), "D");
    let mut live: Vec<u32> = ran.m.conns.keys().map(|k| k.0).collect();
    live.sort();
    assert_eq!(live, [port(1), port(3)]);
    assert_eq!(
        rx_packets(&ran, 2),
        [(op::RST, port(0)), (op::REQUEST, port(3))]
    );
}

#[test]
fn closing_quiet_connections_cannot_hold_back_a_client_that_spoke_first() {
    let port = |i: u32| FIRST_HOST_PORT + i;
    // Thirty connections the guest accepted and never answered on, whose clients then have
    // something for it (a flood's, closing), and one that sent its first bytes with its line.
    let mut ops = Vec::new();
    for i in 0..30 {
        ops.push(connect());
        ops.push(guest(1024, port(i), op::RESPONSE, b""));
    }
    ops.push(connect_eager());
    ops.push(guest(1024, port(30), op::RESPONSE, b""));
    ops.push(Op::HostWrite(0, 1)); // every connection's socket reported readable
    ops.push(Op::GuestRx(2, 4096));
    let ran = run_capped(MAX_CONNECTIONS, ops);
    let first: Vec<(u16, u32)> = rx_packets(&ran, 2);
    assert!(
        first.contains(&(op::RW, port(30))),
        "the client that spoke first waited behind quiet ones: {first:?}"
    );
}
