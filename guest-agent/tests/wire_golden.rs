//! The wire format, pinned: the exact bytes of one representative value of every frame type
//! (each [`Request`], [`ClientFrame`] and [`AgentFrame`] variant, `Hello`, each [`ErrorKind`]),
//! length prefix included. An older agent and a newer host keep talking only while these bytes
//! stay the same: postcard encodes a variant by its index and a struct by its fields in order,
//! so a reordered, removed or changed variant or field fails here.
//!
//! A new variant is appended last and gets its golden value here: the `*_ordinal` functions
//! match every variant without a wildcard, so a new one does not compile until it is given the
//! next ordinal, and `every_variant_is_pinned` then fails until the table has its bytes.
//! Changing an existing encoding on purpose means a new `PROTOCOL_VERSION` (`Hello` pins it).

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use vm_agent_protocol::PROTOCOL_VERSION;
use vm_agent_protocol::container::{
    CapSets, Confine, ContainerExec, ContainerInit, PidNamespace, Rlimit, SeccompAction,
    SeccompArg, SeccompOp, SeccompProfile, SeccompRule,
};
use vm_agent_protocol::frame::{decode_frame, encode_frame};
use vm_agent_protocol::protocol::{
    AgentFrame, AgentInfo, ClientFrame, Command, ErrorKind, ExecRequest, ExitStatus, FileEntry,
    InteractiveRequest, MAX_FRAME, PodMount, Request, ServeId, ServeRequest, ServeStatus, TtySize,
    WireError,
};

/// A full exec request: every field set, so each one's place and encoding is pinned.
fn exec_request() -> ExecRequest {
    ExecRequest {
        command: Command::Argv(vec!["ls".into(), "-l".into()]),
        stdin: b"in".to_vec(),
        env: vec![("A".into(), "b".into())],
        cwd: Some("/w".into()),
        timeout: Some(Duration::from_millis(1500)),
        max_output: Some(300),
        user: Some("u".into()),
    }
}

/// A container's confinement with every field set (and one of each kind in its lists).
fn confine() -> Confine {
    Confine {
        caps: CapSets {
            bounding: 0xa804_25fb,
            effective: 1 << 13,
            permitted: 1 << 13,
            inheritable: 0,
            ambient: 1 << 10,
        },
        no_new_privs: true,
        groups: vec![1234],
        seccomp: Some(SeccompProfile {
            default_action: SeccompAction::Errno(1),
            rules: vec![SeccompRule {
                names: vec!["chmod".into()],
                action: SeccompAction::Allow,
                args: vec![SeccompArg {
                    index: 1,
                    op: SeccompOp::MaskedEq,
                    value: 0o7000,
                    value_two: 0,
                }],
            }],
        }),
        rlimits: vec![Rlimit {
            resource: 7,
            soft: 1024,
            hard: 4096,
        }],
        umask: Some(0o22),
        oom_score_adj: Some(-999),
        init: Some(ContainerInit {
            pid: PidNamespace::Pod,
            readonly_root: true,
            writable: vec!["/etc/hosts".into()],
            masked: vec!["/proc/kcore".into()],
            readonly: vec!["/proc/sys".into()],
            sysctls: vec![("net.core.somaxconn".into(), "1024".into())],
            hostname: Some("web".into()),
        }),
    }
}

fn exit(code: i32) -> ExitStatus {
    ExitStatus {
        code: Some(code),
        signal: None,
        timed_out: false,
    }
}

fn request_ordinal(r: &Request) -> usize {
    match r {
        Request::Ping => 0,
        Request::Exec(_) => 1,
        Request::ExecStream(_) => 2,
        Request::ReadFile { .. } => 3,
        Request::WriteFile { .. } => 4,
        Request::List { .. } => 5,
        Request::ServeStart(_) => 6,
        Request::ServeStatus(_) => 7,
        Request::ServeStop(_) => 8,
        Request::Forward { .. } => 9,
        Request::Shutdown => 10,
        Request::ExecInteractive(_) => 11,
        Request::MakeDirs { .. } => 12,
        Request::Resume { .. } => 13,
        Request::MountTmpfs { .. } => 14,
        Request::SetMode { .. } => 15,
        Request::ExecInteractiveIn { .. } => 16,
        Request::PodMount(_) => 17,
        Request::ExecContainer(_) => 18,
        Request::ListeningPorts => 19,
        Request::Remove { .. } => 20,
    }
}
const REQUESTS: usize = 21;

fn client_ordinal(f: &ClientFrame) -> usize {
    match f {
        ClientFrame::Hello { .. } => 0,
        ClientFrame::Request(_) => 1,
        ClientFrame::Data(_) => 2,
        ClientFrame::DataEnd => 3,
        ClientFrame::Cancel => 4,
        ClientFrame::Resize(_) => 5,
        ClientFrame::Signal { .. } => 6,
    }
}
const CLIENT_FRAMES: usize = 7;

fn agent_ordinal(f: &AgentFrame) -> usize {
    match f {
        AgentFrame::HelloOk { .. } => 0,
        AgentFrame::Error(_) => 1,
        AgentFrame::Pong => 2,
        AgentFrame::Ok => 3,
        AgentFrame::ExecDone { .. } => 4,
        AgentFrame::Stdout(_) => 5,
        AgentFrame::Stderr(_) => 6,
        AgentFrame::Exit(_) => 7,
        AgentFrame::FileStart { .. } => 8,
        AgentFrame::Data(_) => 9,
        AgentFrame::DataEnd => 10,
        AgentFrame::ListBatch(_) => 11,
        AgentFrame::ListEnd => 12,
        AgentFrame::ServeStarted(_) => 13,
        AgentFrame::ServeState(_) => 14,
        AgentFrame::ForwardOk => 15,
        AgentFrame::Started => 16,
        AgentFrame::StdinAck(_) => 17,
        AgentFrame::Ports(_) => 18,
    }
}
const AGENT_FRAMES: usize = 19;

fn error_ordinal(k: ErrorKind) -> usize {
    match k {
        ErrorKind::VersionMismatch => 0,
        ErrorKind::BadRequest => 1,
        ErrorKind::NotFound => 2,
        ErrorKind::Escape => 3,
        ErrorKind::TooLarge => 4,
        ErrorKind::Busy => 5,
        ErrorKind::Io => 6,
        ErrorKind::Spawn => 7,
        ErrorKind::Unsupported => 8,
        ErrorKind::Cancelled => 9,
        ErrorKind::CommandNotFound => 10,
        ErrorKind::NotExecutable => 11,
    }
}
const ERROR_KINDS: usize = 12;

/// Every request, with its golden frame (hex: the `u32` LE length, then the postcard body;
/// inside a `ClientFrame::Request`, whose own tag is the first body byte `01`).
fn requests() -> Vec<(Request, &'static str)> {
    vec![
        (Request::Ping, "020000000100"),
        (
            Request::Exec(exec_request()),
            "2300000001010102026c73022d6c02696e010141016201022f77010180cab5ee0101ac02010175",
        ),
        (
            Request::ExecStream(ExecRequest::shell("echo hi")),
            "11000000010200076563686f206869000000000000",
        ),
        (
            Request::ReadFile {
                root: "/w".into(),
                path: "a/b".into(),
                max: 1 << 20,
            },
            "0c0000000103022f7703612f62808040",
        ),
        (
            Request::WriteFile {
                root: "/".into(),
                path: "f".into(),
                max: 5,
            },
            "070000000104012f016605",
        ),
        (
            Request::List {
                root: "/w".into(),
                path: "".into(),
            },
            "060000000105022f7700",
        ),
        (
            Request::ServeStart(ServeRequest {
                command: Command::Shell("srv".into()),
                env: vec![("P".into(), "1".into())],
                cwd: Some("/w".into()),
                user: None,
            }),
            "1100000001060003737276010150013101022f7700",
        ),
        (Request::ServeStatus(ServeId(7)), "03000000010707"),
        (Request::ServeStop(ServeId(300)), "040000000108ac02"),
        (Request::Forward { port: 8080 }, "040000000109903f"),
        (Request::Shutdown, "02000000010a"),
        (
            Request::ExecInteractive(InteractiveRequest {
                exec: ExecRequest::argv(["sh"]),
                tty: Some(TtySize { rows: 24, cols: 80 }),
            }),
            "10000000010b0101027368000000000000011850",
        ),
        (
            Request::MakeDirs {
                path: "/work".into(),
                owner: Some("app".into()),
            },
            "0d000000010c052f776f726b0103617070",
        ),
        (
            Request::Resume {
                token: std::array::from_fn(|i| i as u8),
                unix_nanos: 300,
                entropy: std::array::from_fn(|i| 0x80 + i as u8),
                generation: 2,
            },
            "45000000010d000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fac02808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f02",
        ),
        (
            Request::MountTmpfs {
                path: "/cache".into(),
                size_bytes: 1 << 20,
            },
            "0c000000010e062f6361636865808040",
        ),
        (
            Request::SetMode {
                path: "/f".into(),
                mode: 0o666,
            },
            "07000000010f022f66b603",
        ),
        (
            Request::ExecInteractiveIn {
                root: "/r".into(),
                request: InteractiveRequest {
                    exec: exec_request(),
                    tty: None,
                },
            },
            "270000000110022f720102026c73022d6c02696e010141016201022f77010180cab5ee0101ac0201017500",
        ),
        (
            Request::PodMount(PodMount::Root {
                device: "/d".into(),
                dir: "/p".into(),
                upper_bytes: 4096,
                memory_bytes: Some(1 << 26),
                pids: None,
                cpu_max: Some((50_000, 100_000)),
            }),
            "18000000011100022f64022f70802001808080200001d08603a08d06",
        ),
        (
            Request::PodMount(PodMount::Volume {
                device: "/d".into(),
                path: "/v".into(),
            }),
            "09000000011101022f64022f76",
        ),
        (
            Request::PodMount(PodMount::Bind {
                source: "/s".into(),
                path: "/t".into(),
            }),
            "09000000011102022f73022f74",
        ),
        (
            Request::PodMount(PodMount::Unmount { path: "/p".into() }),
            "06000000011103022f70",
        ),
        (
            Request::ExecContainer(Box::new(ContainerExec {
                root: Some("/r".into()),
                request: InteractiveRequest {
                    exec: exec_request(),
                    tty: None,
                },
                confine: confine(),
            })),
            "9a000000011201022f720102026c73022d6c02696e010141016201022f77010180cab5ee0101ac02\
             01017500fbcb90c00a804080400080080101d20901010101010563686d6f6400010106801c000107\
             80088020011201cd0f010101010a2f6574632f686f737473010b2f70726f632f6b636f726501092f\
             70726f632f73797301126e65742e636f72652e736f6d6178636f6e6e04313032340103776562",
        ),
        (Request::ListeningPorts, "020000000113"),
        (
            Request::Remove {
                root: "/r".into(),
                path: "f".into(),
            },
            "070000000114022f720166",
        ),
    ]
}

fn client_frames() -> Vec<(ClientFrame, &'static str)> {
    let mut token = [0u8; vm_agent_protocol::token::TOKEN_LEN];
    for (i, b) in token.iter_mut().enumerate() {
        *b = i as u8;
    }
    vec![
        (
            ClientFrame::Hello {
                version: PROTOCOL_VERSION,
                token,
            },
            "220000000004000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
        ),
        (ClientFrame::Request(Request::Ping), "020000000100"),
        (ClientFrame::Data(b"ab".to_vec()), "0400000002026162"),
        (ClientFrame::DataEnd, "0100000003"),
        (ClientFrame::Cancel, "0100000004"),
        (
            ClientFrame::Resize(TtySize {
                rows: 50,
                cols: 200,
            }),
            "040000000532c801",
        ),
        (
            ClientFrame::Signal {
                signal: 15,
                all: true,
            },
            "03000000061e01",
        ),
    ]
}

fn agent_frames() -> Vec<(AgentFrame, &'static str)> {
    vec![
        (
            AgentFrame::HelloOk {
                version: PROTOCOL_VERSION,
                info: AgentInfo {
                    agent_version: "0.1.0".into(),
                    hostname: "vm".into(),
                    pid1: true,
                    cgroups: false,
                },
            },
            "0d000000000405302e312e3002766d0100",
        ),
        (
            AgentFrame::Error(WireError {
                kind: ErrorKind::NotFound,
                message: "no".into(),
            }),
            "050000000102026e6f",
        ),
        (AgentFrame::Pong, "0100000002"),
        (AgentFrame::Ok, "0100000003"),
        (
            AgentFrame::ExecDone {
                status: exit(3),
                truncated: true,
            },
            "06000000040106000001",
        ),
        (AgentFrame::Stdout(b"out".to_vec()), "0500000005036f7574"),
        (AgentFrame::Stderr(b"err".to_vec()), "050000000603657272"),
        (
            AgentFrame::Exit(ExitStatus {
                code: None,
                signal: Some(9),
                timed_out: true,
            }),
            "050000000700011201",
        ),
        (
            AgentFrame::FileStart { size: 1 << 32 },
            "06000000088080808010",
        ),
        (AgentFrame::Data(vec![0, 255]), "04000000090200ff"),
        (AgentFrame::DataEnd, "010000000a"),
        (
            AgentFrame::ListBatch(vec![FileEntry {
                path: "a/b".into(),
                size: 2,
            }]),
            "070000000b0103612f6202",
        ),
        (AgentFrame::ListEnd, "010000000c"),
        (AgentFrame::ServeStarted(ServeId(1)), "020000000d01"),
        (
            AgentFrame::ServeState(ServeStatus {
                running: false,
                exit: Some(exit(0)),
                output_tail: b"t".to_vec(),
            }),
            "090000000e0001010000000174",
        ),
        (AgentFrame::ForwardOk, "010000000f"),
        (AgentFrame::Started, "0100000010"),
        (AgentFrame::StdinAck(65536), "0400000011808004"),
        (AgentFrame::Ports(vec![80, 8080]), "05000000120250903f"),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Encodes `value` as a frame and compares it with `golden`; decodes the golden bytes back to
/// the same value. Returns a line describing a mismatch.
fn check<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    value: &T,
    golden: &str,
) -> Option<String> {
    let bytes = encode_frame(value, MAX_FRAME).expect("encode");
    let got = hex(&bytes);
    if got != golden {
        return Some(format!(
            "{value:?}\n  golden: {golden:?}\n  now:    {got:?}"
        ));
    }
    let (back, used) = decode_frame::<T>(&bytes, MAX_FRAME).expect("decode golden");
    assert_eq!(used, bytes.len());
    assert_eq!(&back, value, "golden bytes decode to another value");
    None
}

fn assert_all<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(table: &[(T, &str)]) {
    let wrong: Vec<String> = table.iter().filter_map(|(v, g)| check(v, g)).collect();
    assert!(
        wrong.is_empty(),
        "the wire format changed (an old agent and a new host would not understand each \
         other):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_request_keeps_its_bytes() {
    let table: Vec<(ClientFrame, &str)> = requests()
        .into_iter()
        .map(|(r, g)| (ClientFrame::Request(r), g))
        .collect();
    assert_all(&table);
}

#[test]
fn every_client_frame_keeps_its_bytes() {
    assert_all(&client_frames());
}

#[test]
fn every_agent_frame_keeps_its_bytes() {
    assert_all(&agent_frames());
}

#[test]
fn hello_pins_the_protocol_version() {
    // A version bump is deliberate: it changes the `Hello`/`HelloOk` goldens and this line.
    assert_eq!(PROTOCOL_VERSION, 4);
}

#[test]
fn every_error_kind_keeps_its_tag() {
    let kinds = [
        ErrorKind::VersionMismatch,
        ErrorKind::BadRequest,
        ErrorKind::NotFound,
        ErrorKind::Escape,
        ErrorKind::TooLarge,
        ErrorKind::Busy,
        ErrorKind::Io,
        ErrorKind::Spawn,
        ErrorKind::Unsupported,
        ErrorKind::Cancelled,
        ErrorKind::CommandNotFound,
        ErrorKind::NotExecutable,
    ];
    let tags: Vec<u8> = kinds
        .iter()
        .map(|k| postcard::to_stdvec(k).expect("encode"))
        .map(|b| {
            assert_eq!(b.len(), 1);
            b[0]
        })
        .collect();
    assert_eq!(tags, (0..ERROR_KINDS as u8).collect::<Vec<_>>());
    let ordinals: BTreeSet<usize> = kinds.iter().map(|k| error_ordinal(*k)).collect();
    assert_eq!(ordinals, (0..ERROR_KINDS).collect());
}

#[test]
fn every_variant_is_pinned() {
    let reqs: BTreeSet<usize> = requests().iter().map(|(r, _)| request_ordinal(r)).collect();
    assert_eq!(
        reqs,
        (0..REQUESTS).collect(),
        "a Request variant has no golden"
    );
    let client: BTreeSet<usize> = client_frames()
        .iter()
        .map(|(f, _)| client_ordinal(f))
        .collect();
    assert_eq!(
        client,
        (0..CLIENT_FRAMES).collect(),
        "a ClientFrame variant has no golden"
    );
    let agent: BTreeSet<usize> = agent_frames()
        .iter()
        .map(|(f, _)| agent_ordinal(f))
        .collect();
    assert_eq!(
        agent,
        (0..AGENT_FRAMES).collect(),
        "an AgentFrame variant has no golden"
    );
}
