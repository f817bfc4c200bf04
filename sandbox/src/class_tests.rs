//! Every [`Class`] from a real error of the library's own types, most of them made by the call
//! that makes them in use (a spec validated, a driver selected, a VM attached), and the walk
//! through the wrappers a front end sees them in.

use std::time::Duration;

use vm_drivers::{DriverError, MachineError, Registry};
use vm_spec::{Containment, Guarantees, Limits, Policy, Spec, Trust};

use super::*;
use crate::state::Runtime;
use crate::state::named::NamedVm;

fn agent_error(kind: ErrorKind, message: &str) -> SandboxError {
    let source = MachineError::Agent(ClientError::Agent {
        kind,
        message: message.into(),
    });
    SandboxError::Machine {
        op: "exec stream",
        source,
    }
}

fn select_error(name: Option<&str>, policy: &Policy) -> SandboxError {
    let registry = Registry::with_defaults();
    match crate::select(&registry, name, Trust::Untrusted, policy) {
        Ok(d) => panic!("{name:?} selected {}", d.name()),
        Err(e) => SandboxError::Select(e),
    }
}

/// An error of `class`, as the library makes it.
fn example(class: Class, dir: &std::path::Path) -> Box<dyn Error + 'static> {
    let limits = Limits {
        vcpus: 1,
        mem_mib: 1,
        pids: 256,
        wall: None,
    };
    let machine = |source| SandboxError::Machine { op: "exec", source };
    match class {
        Class::Usage => Box::new(select_error(Some("nosuch"), &Policy::default())),
        Class::Path => Box::new(SandboxError::from(
            crate::confine::relative("../etc/passwd", false).unwrap_err(),
        )),
        Class::Refused => {
            let image = crate::images::default_spec_image().unwrap_or_else(|_| vm_spec::Image {
                kernel: "/boot/vmlinux".into(),
                bz_image: None,
                initrd: None,
                rootfs: None,
                digests: Default::default(),
                config: Default::default(),
                source: None,
            });
            let spec = Spec::new(image, Guarantees::untrusted(limits, vec![]));
            Box::new(SandboxError::Spec(spec.validate().unwrap_err()))
        }
        Class::Forbidden => Box::new(SandboxError::Admit(
            vm_spec::admit_level(
                "tcg",
                Containment::UserKernel,
                Trust::Untrusted,
                &Policy::default(),
            )
            .unwrap_err(),
        )),
        // hvf is a stub on Linux: never available, whatever the host.
        Class::NoDriver => Box::new(select_error(Some("hvf"), &Policy::default())),
        Class::NotFound => {
            let runtime = Runtime::at(dir.join("state")).unwrap();
            Box::new(NamedVm::attach(&runtime, "nosuch").unwrap_err())
        }
        Class::NotRunning => Box::new(NamedError::NoSocket("box".into())),
        Class::Paused => Box::new(machine(MachineError::Paused { name: "box".into() })),
        Class::BootFailed => Box::new(SandboxError::Boot {
            driver: "tcg",
            source: DriverError::InvalidPlan {
                reason: "no kernel".into(),
            },
        }),
        Class::WallExpired => Box::new(machine(MachineError::WallExpired {
            name: "box".into(),
            wall: Duration::from_secs(1),
        })),
        Class::GuestError => Box::new(machine(MachineError::Closed { name: "box".into() })),
        Class::CommandNotFound => Box::new(agent_error(
            ErrorKind::CommandNotFound,
            "nosuch: command not found",
        )),
        Class::NotExecutable => Box::new(agent_error(
            ErrorKind::NotExecutable,
            "/etc/passwd: cannot execute: Permission denied",
        )),
        Class::Busy => Box::new(agent_error(ErrorKind::Busy, "too many connections")),
        Class::ServeFailed => Box::new(SandboxError::Serve(ServeError::ExitedEarly {
            status: None,
        })),
        Class::Image => Box::new(NoImage(
            crate::images::images_in(&dir.join("no-images")).unwrap_err(),
        )),
        Class::Unsupported => Box::new(SandboxError::Unsupported("interactive exec")),
        Class::Internal => Box::new(SandboxError::RunDir(std::io::Error::other("disk full"))),
    }
}

#[test]
fn every_class_has_an_error_that_classifies_as_it() {
    let dir = tempfile::tempdir().unwrap();
    for class in Class::ALL {
        let e = example(class, dir.path());
        assert_eq!(classify(e.as_ref()).class, class, "{e:?}");
    }
    let refusals: Vec<_> = Class::ALL.into_iter().filter(|c| c.is_refusal()).collect();
    use Class::*;
    assert_eq!(refusals, [Usage, Path, Refused, Forbidden, NoDriver]);
}

/// A refusal names what to change; the wrappers a front end adds do not hide the class.
#[test]
fn refusals_name_their_field_through_wrappers() {
    let dir = tempfile::tempdir().unwrap();
    let field = |class| classify(example(class, dir.path()).as_ref()).field;
    assert_eq!(field(Class::Usage).as_deref(), Some("driver"));
    assert_eq!(
        field(Class::Refused).as_deref(),
        Some("guarantees.limits.mem_mib")
    );
    // The message is the deciding error's own, not the wrappers'.
    let refused = classify(example(Class::Refused, dir.path()).as_ref());
    assert!(
        refused
            .message
            .starts_with("guarantees.limits.mem_mib: 1 refused")
    );
    assert_eq!(field(Class::Forbidden).as_deref(), Some("allow_emulation"));
    assert_eq!(field(Class::Path), None);

    // A DAX window: a size no window can have is the caller's to change; none on the
    // driver is what it does not do.
    let window = |source| SandboxError::DaxWindow {
        driver: "kvm",
        source,
    };
    let odd = window(DriverError::InvalidPlan {
        reason: "dax_window_mib: 3 MiB is not a multiple of 2 MiB".into(),
    });
    assert_eq!(odd.class().class, Class::Refused);
    assert_eq!(odd.class().field.as_deref(), Some("dax_window_mib"));
    let none = window(DriverError::Unsupported {
        driver: "tcg",
        reason: "no window".into(),
    });
    assert_eq!(none.class().class, Class::Unsupported);

    // Attaching is decided by its cause: here, an agent that found no such command.
    let attach = NamedError::Attach {
        name: "box".into(),
        source: Box::new(agent_error(
            ErrorKind::CommandNotFound,
            "x: command\nnot found",
        )),
    };
    let c = classify(&attach);
    assert_eq!(c.class, Class::CommandNotFound);
    assert_eq!(c.command_line.as_deref(), Some("x: command not found"));
    assert_eq!(
        SandboxError::NoCommand.class().field.as_deref(),
        Some("argv")
    );

    // No driver at all; and none unless a policy flag is given, naming the flag's field.
    let registry = Registry::new(vec![]);
    let e = crate::select(&registry, None, Trust::Untrusted, &Policy::default()).unwrap_err();
    assert_eq!(classify(&e).class, Class::NoDriver);
    assert_eq!(classify(&e).field, None);
    let e = SelectError::NoDriver {
        trust: Trust::Untrusted,
        required: Containment::MicroVm,
        diagnoses: vec![],
        allowed_by: Some(vm_spec::ALLOW_EMULATION_FLAG),
    };
    let c = classify(&e);
    assert_eq!(c.class, Class::NoDriver);
    assert_eq!(c.field.as_deref(), Some("allow_emulation"));
    assert_eq!(c.message, e.to_string());

    // Unknown errors, and a snapshot failure decided by its cause.
    assert_eq!(classify(&std::io::Error::other("x")).class, Class::Internal);
    let snap = SandboxError::Snapshot(SnapshotError::Machine(
        vm_drivers::snapshot::SnapshotError::Machine(MachineError::Paused { name: "b".into() }),
    ));
    assert_eq!(snap.class().class, Class::Paused);
    let other = SandboxError::Snapshot(SnapshotError::Machine(
        vm_drivers::snapshot::SnapshotError::Unsupported {
            driver: "tcg",
            reason: "QEMU".into(),
        },
    ));
    assert_eq!(other.class().class, Class::Forbidden);
}
