//! Every error class through all three front ends, side by side: the CLI's exit code, the
//! Python SDK's exception and this shim's ttrpc code. The CLI's and the SDK's mappings are
//! compiled here from their own files (each is free of the rest of its crate for this), so
//! the table below is checked against the code the front ends run.

use containerd_shim::protos::ttrpc::Code;
use vm_sandbox::{Class, Classified};

#[path = "../../cli/src/exit/codes.rs"]
#[allow(dead_code)]
mod cli;
#[path = "../../python/src/failure/kind.rs"]
#[allow(dead_code)]
mod sdk;

use sdk::Kind;

/// (class, `vm`'s exit code, the SDK's exception without / with a named field, ttrpc code).
const TABLE: [(Class, u8, Kind, Kind, Code); 18] = [
    (
        Class::Usage,
        2,
        Kind::VmError,
        Kind::SpecRefused,
        Code::INVALID_ARGUMENT,
    ),
    (
        Class::Path,
        2,
        Kind::PathRefused,
        Kind::PathRefused,
        Code::INVALID_ARGUMENT,
    ),
    (
        Class::Refused,
        126,
        Kind::SpecRefused,
        Kind::SpecRefused,
        Code::INVALID_ARGUMENT,
    ),
    (
        Class::Forbidden,
        126,
        Kind::VmError,
        Kind::SpecRefused,
        Code::FAILED_PRECONDITION,
    ),
    (
        Class::NoDriver,
        127,
        Kind::NoDriver,
        Kind::SpecRefused,
        Code::FAILED_PRECONDITION,
    ),
    (
        Class::NotFound,
        125,
        Kind::NoSuchVm,
        Kind::NoSuchVm,
        Code::NOT_FOUND,
    ),
    (
        Class::NotRunning,
        125,
        Kind::NotRunning,
        Kind::NotRunning,
        Code::FAILED_PRECONDITION,
    ),
    (
        Class::Paused,
        125,
        Kind::Paused,
        Kind::Paused,
        Code::FAILED_PRECONDITION,
    ),
    (
        Class::BootFailed,
        125,
        Kind::BootFailed,
        Kind::BootFailed,
        Code::INTERNAL,
    ),
    (
        Class::WallExpired,
        124,
        Kind::WallExpired,
        Kind::WallExpired,
        Code::DEADLINE_EXCEEDED,
    ),
    (
        Class::GuestError,
        125,
        Kind::GuestError,
        Kind::GuestError,
        Code::INTERNAL,
    ),
    (
        Class::CommandNotFound,
        127,
        Kind::GuestError,
        Kind::GuestError,
        Code::NOT_FOUND,
    ),
    (
        Class::NotExecutable,
        126,
        Kind::GuestError,
        Kind::GuestError,
        Code::FAILED_PRECONDITION,
    ),
    (
        Class::Busy,
        125,
        Kind::GuestError,
        Kind::GuestError,
        Code::RESOURCE_EXHAUSTED,
    ),
    (
        Class::ServeFailed,
        125,
        Kind::ServeFailed,
        Kind::ServeFailed,
        Code::INTERNAL,
    ),
    (
        Class::Image,
        125,
        Kind::ImageError,
        Kind::ImageError,
        Code::FAILED_PRECONDITION,
    ),
    (
        Class::Unsupported,
        125,
        Kind::VmError,
        Kind::VmError,
        Code::UNIMPLEMENTED,
    ),
    (
        Class::Internal,
        125,
        Kind::VmError,
        Kind::VmError,
        Code::INTERNAL,
    ),
];

fn classified(class: Class, field: Option<&str>) -> Classified {
    let mut c = vm_sandbox::classify(&std::io::Error::other("x"));
    c.class = class;
    c.field = field.map(str::to_string);
    c
}

#[test]
fn every_class_has_one_row_in_the_order_of_the_enum() {
    let classes: Vec<Class> = TABLE.iter().map(|r| r.0).collect();
    assert_eq!(classes, Class::ALL.to_vec());
}

#[test]
fn every_class_maps_the_same_in_the_cli_the_sdk_and_the_shim() {
    for (class, exit, bare, named, rpc) in TABLE {
        assert_eq!(cli::code(class), exit, "{class:?}: vm's exit code");
        assert_eq!(sdk::kind(&classified(class, None)), bare, "{class:?}: SDK");
        assert_eq!(
            sdk::kind(&classified(class, Some("driver"))),
            named,
            "{class:?}: SDK, field"
        );
        assert_eq!(super::code(class), rpc, "{class:?}: ttrpc code");
    }
}

#[test]
fn a_refusal_is_never_internal_and_never_a_failure_code() {
    for class in Class::ALL {
        let (exit, rpc) = (cli::code(class), super::code(class));
        if class.is_refusal() {
            assert!([2, 126, 127].contains(&exit), "{class:?} exits {exit}");
            assert!(
                matches!(rpc, Code::INVALID_ARGUMENT | Code::FAILED_PRECONDITION),
                "{class:?} is {rpc:?} to containerd"
            );
        } else {
            assert_ne!(exit, 2, "{class:?} exits as a usage error");
        }
    }
}

#[test]
fn a_refusal_from_the_sandbox_reaches_containerd_naming_what_to_change() {
    // A real refusal as the sandbox makes it: a driver name this host does not know.
    let registry = vm_sandbox::drivers::Registry::with_defaults();
    let policy = vm_spec::Policy::default();
    let Err(refused) = vm_sandbox::select(
        &registry,
        Some("nosuch"),
        vm_spec::Trust::Untrusted,
        &policy,
    ) else {
        panic!("an unknown driver was selected");
    };
    let e =
        super::ShimError::sandbox("selecting a driver")(vm_sandbox::SandboxError::Select(refused));
    let containerd_shim::protos::ttrpc::Error::RpcStatus(status) =
        containerd_shim::protos::ttrpc::Error::from(e)
    else {
        panic!("not a status");
    };
    assert_eq!(status.code(), Code::INVALID_ARGUMENT);
    assert!(status.message().contains("nosuch"), "{}", status.message());
}
