//! A pod's security settings, through containerd's CRI (the harness of `cri.rs`): each one is
//! enforced inside the guest by the agent, never accepted and dropped, each checked by a test
//! of its own with the value kubelet would send and what a process in the container sees:
//!
//! - dropped capabilities are not in the bounding set (`drop: [NET_RAW]`, `drop: [ALL]`);
//! - a seccomp profile is installed (a `Localhost` one blocking `chmod`; `RuntimeDefault`:
//!   `Seccomp: 2`; none: `Seccomp: 0`);
//! - `readOnlyRootFilesystem` makes the root read-only (kubelet's `/etc/hosts` stays
//!   writable);
//! - `maskedPaths` and `readonlyPaths` hide and write-protect what they name;
//! - `allowPrivilegeEscalation` is `no_new_privs` as given, for a user that is not root;
//! - `supplementalGroups` are the process's groups;
//! - the pod's namespaced sysctls and its hostname are the VM's (the pod's namespaces);
//! - a container's PID namespace is its own (its command is PID 1) unless it shares the
//!   pod's (`shareProcessNamespace`: the sandbox's process is PID 1) or asks for the host's
//!   (`hostPID`: the pod VM's, where every container of the pod is seen);
//! - a container killed by its memory limit ends `OOMKilled` (the shim's `TaskOOM`);
//! - settings the guest cannot honour are refused naming the field, a pod's before its VM
//!   boots (a non-namespaced sysctl, `hostIPC`), a container's at its start (a seccomp
//!   notification).
//!
//! Skipped (counted) as `cri.rs` is; no guest driver fails, as elsewhere.

#[macro_use]
mod common;
#[allow(dead_code)]
#[path = "cri/client.rs"]
mod client;
#[allow(dead_code)]
#[macro_use]
#[path = "cri/harness.rs"]
mod harness;
#[allow(dead_code)]
#[path = "cri/steps.rs"]
mod steps;

use client::{Cri, container_config, rw_mount};
use harness::{CriContainerd, IMAGE};
use k8s_cri::v1::security_profile::ProfileType;
use k8s_cri::v1::{
    Capability, ContainerState, Int64Value, LinuxContainerConfig, LinuxContainerResources,
    LinuxContainerSecurityContext, NamespaceMode, PodSandboxConfig, SecurityProfile,
};
use steps::{BOOT_SECS, remove_pod_leaves_nothing, run_pod, start, wait_state};

/// A running pod and what its containers need.
struct Pod {
    cd: CriContainerd,
    cri: Cri,
    id: String,
    config: PodSandboxConfig,
    dir: std::path::PathBuf,
    containers: Vec<String>,
}

impl Pod {
    /// containerd started and the pod `name` running (`tweak` edits its config).
    fn run(name: &str, tweak: impl FnOnce(&mut PodSandboxConfig)) -> Pod {
        let (cd, mut cri, handler) = start();
        let (id, config, dir) = run_pod(&cd, &mut cri, &handler, name, tweak);
        Pod {
            cd,
            cri,
            id,
            config,
            dir,
            containers: Vec::new(),
        }
    }

    /// The container `name` running `sleep` (with `sc` as its security context), running.
    fn sleeper(
        &mut self,
        name: &str,
        sc: impl FnOnce(&mut LinuxContainerSecurityContext),
    ) -> String {
        self.container(name, &["sleep", "3600"], vec![], sc)
    }

    fn container(
        &mut self,
        name: &str,
        command: &[&str],
        mounts: Vec<k8s_cri::v1::Mount>,
        sc: impl FnOnce(&mut LinuxContainerSecurityContext),
    ) -> String {
        let id = self.started(name, command, mounts, |linux| {
            sc(linux.security_context.get_or_insert_with(Default::default))
        });
        wait_state(
            &self.cd,
            &mut self.cri,
            &id,
            ContainerState::ContainerRunning,
            BOOT_SECS,
        );
        id
    }

    /// The container `name` created and started (`linux` edits its Linux config).
    fn started(
        &mut self,
        name: &str,
        command: &[&str],
        mounts: Vec<k8s_cri::v1::Mount>,
        linux: impl FnOnce(&mut LinuxContainerConfig),
    ) -> String {
        let mut config = container_config(name, IMAGE, command, mounts);
        linux(config.linux.as_mut().expect("linux config"));
        let id = self
            .cri
            .create(&self.id, &config, &self.config)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e:?}\n{}", self.cd.log_tail()));
        self.containers.push(id.clone());
        self.cri
            .start(&id)
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e:?}\n{}", self.cd.log_tail()));
        id
    }

    /// Waits for `id` to exit; its status.
    fn exited(&mut self, id: &str) -> k8s_cri::v1::ContainerStatus {
        wait_state(
            &self.cd,
            &mut self.cri,
            id,
            ContainerState::ContainerExited,
            BOOT_SECS,
        );
        self.cri.status(id).expect("ContainerStatus")
    }

    /// `ExecSync` of `cmd` in `id`: stdout, stderr, exit code.
    fn exec(&mut self, id: &str, cmd: &[&str]) -> (String, String, i32) {
        let out = self
            .cri
            .exec_sync(id, cmd, 60)
            .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}\n{}", self.cd.log_tail()));
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.exit_code,
        )
    }

    /// The value of `field` in the process's `/proc/self/status` (a `cat` run by `exec`).
    fn status_field(&mut self, id: &str, field: &str) -> String {
        let (out, _, _) = self.exec(id, &["cat", "/proc/self/status"]);
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {field} in /proc/self/status:\n{out}"))
    }

    /// Removes the pod: nothing of it is left.
    fn remove(mut self) {
        let ids: Vec<&str> = self.containers.iter().map(String::as_str).collect();
        remove_pod_leaves_nothing(&self.cd, &mut self.cri, &self.id, &ids);
    }
}

/// containerd's default capability set (Docker's), as the bounding set's hex.
const DEFAULT_CAPS_HEX: &str = "00000000a80425fb";

#[test]
fn dropped_capabilities_are_not_in_the_guest_process() {
    cri_preflight!("dropped_capabilities_are_not_in_the_guest_process");
    let mut pod = Pod::run("caps", |_| {});
    let drop = |caps: &[&str]| {
        let caps: Vec<String> = caps.iter().map(|c| c.to_string()).collect();
        move |sc: &mut LinuxContainerSecurityContext| {
            sc.capabilities = Some(Capability {
                drop_capabilities: caps,
                ..Default::default()
            })
        }
    };
    let default = pod.sleeper("default", |_| {});
    let no_raw = pod.sleeper("no-net-raw", drop(&["NET_RAW"]));
    let none = pod.sleeper("no-caps", drop(&["ALL"]));
    assert_eq!(pod.status_field(&default, "CapBnd"), DEFAULT_CAPS_HEX);
    // Bit 13 (CAP_NET_RAW) cleared.
    assert_eq!(pod.status_field(&no_raw, "CapBnd"), "00000000a80405fb");
    assert_eq!(pod.status_field(&none, "CapBnd"), "0000000000000000");
    assert_eq!(pod.status_field(&none, "CapEff"), "0000000000000000");
    pod.remove();
}

#[test]
fn a_seccomp_profile_is_installed_for_the_containers_processes() {
    cri_preflight!("a_seccomp_profile_is_installed_for_the_containers_processes");
    let mut pod = Pod::run("seccomp", |_| {});
    let profile = pod.dir.join("block-chmod.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["chmod", "fchmodat", "fchmodat2"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .expect("the profile");
    let with = |ty: ProfileType, path: &std::path::Path| {
        let localhost_ref = match ty {
            ProfileType::Localhost => path.to_string_lossy().into_owned(),
            _ => String::new(),
        };
        move |sc: &mut LinuxContainerSecurityContext| {
            sc.seccomp = Some(SecurityProfile {
                profile_type: ty.into(),
                localhost_ref,
            })
        }
    };
    let blocked = pod.sleeper("localhost", with(ProfileType::Localhost, &profile));
    let default = pod.sleeper("default", with(ProfileType::RuntimeDefault, &profile));
    let unconfined = pod.sleeper("unconfined", with(ProfileType::Unconfined, &profile));
    // The image's root has no /tmp: the file is made first (open is not blocked).
    let chmod = |mode: &str| format!("touch /f && chmod {mode} /f");
    let (_, err, code) = pod.exec(&blocked, &["sh", "-c", &chmod("400")]);
    assert!(
        code != 0 && err.contains("Operation not permitted"),
        "chmod under a profile blocking it: {code} {err:?}"
    );
    assert_eq!(pod.status_field(&blocked, "Seccomp"), "2");
    assert_eq!(pod.status_field(&default, "Seccomp"), "2");
    assert_eq!(pod.status_field(&unconfined, "Seccomp"), "0");
    // The unconfined one can chmod: the filter is the profile's, not a blanket one.
    assert_eq!(pod.exec(&unconfined, &["sh", "-c", &chmod("400")]).2, 0);
    pod.remove();
}

#[test]
fn a_read_only_root_is_read_only_but_kubelets_files_stay_writable() {
    cri_preflight!("a_read_only_root_is_read_only_but_kubelets_files_stay_writable");
    let mut pod = Pod::run("rofs", |_| {});
    let hosts = pod.dir.join("etc-hosts");
    std::fs::write(&hosts, "127.0.0.1\tlocalhost\n").expect("etc-hosts");
    let mounts = vec![rw_mount(&hosts, "/etc/hosts")];
    let ro = pod.container("ro", &["sleep", "3600"], mounts, |sc| {
        sc.readonly_rootfs = true
    });
    let rw = pod.sleeper("rw", |_| {});
    let (_, err, code) = pod.exec(&ro, &["sh", "-c", "echo x > /written"]);
    assert!(
        code != 0 && err.contains("Read-only file system"),
        "a write to a read-only root: {code} {err:?}"
    );
    let appended = pod.exec(
        &ro,
        &[
            "sh",
            "-c",
            "echo '10.0.0.9 db' >> /etc/hosts && cat /etc/hosts",
        ],
    );
    assert_eq!(appended.2, 0, "kubelet's /etc/hosts: {appended:?}");
    assert!(appended.0.contains("10.0.0.9 db"), "{appended:?}");
    assert_eq!(pod.exec(&rw, &["sh", "-c", "echo x > /written"]).2, 0);
    pod.remove();
}

/// A read-only volume is not recursive (runc's meaning; critest's non-recursive readonly
/// mounts): a tmpfs the host mounted beneath its source is writable in the container, the
/// rest of the volume is not, and the host's tmpfs is never written.
#[test]
fn a_writable_tmpfs_beneath_a_read_only_volume_stays_writable() {
    cri_preflight!("a_writable_tmpfs_beneath_a_read_only_volume_stays_writable");
    let mut pod = Pod::run("rro", |_| {});
    let vol = pod.dir.join("vol");
    let sub = vol.join("tmpfs");
    std::fs::create_dir_all(&sub).expect("volume");
    std::fs::write(vol.join("data"), "host\n").expect("data");
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "none"])
        .arg(&sub)
        .status()
        .expect("mount");
    assert!(mounted.success(), "mount -t tmpfs: {mounted}");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(sub.clone());
    let mut ro = rw_mount(&vol, "/mnt");
    ro.readonly = true;
    let id = pod.container("c", &["sleep", "3600"], vec![ro], |_| {});
    let (out, err, code) = pod.exec(&id, &["sh", "-c", "touch /mnt/tmpfs/file && cat /mnt/data"]);
    assert_eq!(
        (out.as_str(), code),
        ("host\n", 0),
        "the tmpfs beneath: {err:?}"
    );
    let (_, err, code) = pod.exec(&id, &["sh", "-c", "touch /mnt/file"]);
    assert!(
        code != 0 && err.contains("Read-only file system"),
        "the read-only volume itself: {code} {err:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&sub).expect("host tmpfs").collect();
    assert!(left.is_empty(), "the host's tmpfs was written: {left:?}");
    pod.remove();
}

#[test]
fn masked_and_read_only_paths_are_hidden_and_write_protected() {
    cri_preflight!("masked_and_read_only_paths_are_hidden_and_write_protected");
    let mut pod = Pod::run("paths", |_| {});
    let plain = pod.sleeper("plain", |_| {});
    let guarded = pod.sleeper("guarded", |sc| {
        sc.masked_paths = vec!["/proc/cmdline".into(), "/sys/kernel".into()];
        sc.readonly_paths = vec!["/proc/sys".into()];
    });
    let cmdline = |pod: &mut Pod, id: &str| pod.exec(id, &["cat", "/proc/cmdline"]).0;
    assert!(
        !cmdline(&mut pod, &plain).is_empty(),
        "the guest's own cmdline"
    );
    assert_eq!(
        cmdline(&mut pod, &guarded),
        "",
        "a masked file reads as /dev/null"
    );
    let listing = pod.exec(&guarded, &["ls", "-A", "/sys/kernel"]);
    assert_eq!(
        (listing.0.as_str(), listing.2),
        ("", 0),
        "a masked directory is empty"
    );
    let write = "echo 1 > /proc/sys/kernel/shm_rmid_forced";
    let (_, err, code) = pod.exec(&guarded, &["sh", "-c", write]);
    assert!(
        code != 0 && err.contains("Read-only file system"),
        "a write under a read-only path: {code} {err:?}"
    );
    pod.remove();
}

#[test]
fn no_new_privs_is_as_the_pod_asks() {
    cri_preflight!("no_new_privs_is_as_the_pod_asks");
    let mut pod = Pod::run("nnp", |_| {});
    let as_user = |nnp: bool| {
        move |sc: &mut LinuxContainerSecurityContext| {
            sc.run_as_user = Some(Int64Value { value: 1000 });
            sc.no_new_privs = nnp;
        }
    };
    let escalates = pod.sleeper("escalation-allowed", as_user(false));
    let locked = pod.sleeper("escalation-denied", as_user(true));
    assert_eq!(pod.status_field(&escalates, "NoNewPrivs"), "0");
    assert_eq!(pod.status_field(&locked, "NoNewPrivs"), "1");
    assert!(pod.status_field(&escalates, "Uid").starts_with("1000\t"));
    pod.remove();
}

#[test]
fn supplemental_groups_are_the_processes_groups() {
    cri_preflight!("supplemental_groups_are_the_processes_groups");
    let mut pod = Pod::run("groups", |_| {});
    let id = pod.sleeper("grouped", |sc| sc.supplemental_groups = vec![1234, 5678]);
    let (out, _, code) = pod.exec(&id, &["id", "-G"]);
    let groups: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(code, 0);
    assert!(
        groups.contains(&"1234") && groups.contains(&"5678"),
        "id -G: {out:?}"
    );
    pod.remove();
}

#[test]
fn the_pods_sysctls_and_hostname_are_the_vms() {
    cri_preflight!("the_pods_sysctls_and_hostname_are_the_vms");
    let mut pod = Pod::run("sysctl", |c| {
        c.hostname = "sysctl-host".into();
        let linux = c.linux.as_mut().expect("linux config");
        linux.sysctls = [
            ("kernel.shm_rmid_forced", "1"),
            ("fs.mqueue.msg_max", "100"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    });
    let id = pod.sleeper("reader", |_| {});
    let read = |pod: &mut Pod, path: &str| pod.exec(&id, &["cat", path]).0.trim().to_string();
    assert_eq!(read(&mut pod, "/proc/sys/kernel/shm_rmid_forced"), "1");
    assert_eq!(read(&mut pod, "/proc/sys/fs/mqueue/msg_max"), "100");
    assert_eq!(read(&mut pod, "/proc/sys/kernel/hostname"), "sysctl-host");
    pod.remove();
}

/// A security context's edit that puts the container in the PID namespace `mode`.
fn pid_mode(mode: NamespaceMode) -> impl FnOnce(&mut LinuxContainerSecurityContext) {
    move |sc| {
        if let Some(ns) = sc.namespace_options.as_mut() {
            ns.pid = mode.into();
        }
    }
}

/// PID 1's command line in `id`'s PID namespace, its NULs as spaces.
fn pid1(pod: &mut Pod, id: &str) -> String {
    let out = pod.exec(id, &["cat", "/proc/1/cmdline"]).0;
    out.replace('\0', " ").trim().to_string()
}

/// Every command line `id` sees in its `/proc`.
fn seen(pod: &mut Pod, id: &str) -> String {
    let everyone = "cat /proc/[0-9]*/cmdline | tr '\\0' ' '";
    pod.exec(id, &["sh", "-c", everyone]).0
}

#[test]
fn a_containers_pid_namespace_is_its_own_unless_it_shares_the_pods() {
    cri_preflight!("a_containers_pid_namespace_is_its_own_unless_it_shares_the_pods");
    let mut pod = Pod::run("pids", |_| {});
    let own = pod.container(
        "own",
        &["sleep", "2001"],
        vec![],
        pid_mode(NamespaceMode::Container),
    );
    let shared = pod.container(
        "shared",
        &["sleep", "2002"],
        vec![],
        pid_mode(NamespaceMode::Pod),
    );
    assert_eq!(
        pid1(&mut pod, &own),
        "sleep 2001",
        "its own command is PID 1"
    );
    // The sandbox's command (the image's), as with shareProcessNamespace.
    assert_eq!(pid1(&mut pod, &shared), "sleep 2147483647");
    let from_own = seen(&mut pod, &own);
    assert!(
        !from_own.contains("sleep 2002") && !from_own.contains("sleep 2147483647"),
        "its own namespace sees only itself: {from_own:?}"
    );
    let from_shared = seen(&mut pod, &shared);
    assert!(
        from_shared.contains("sleep 2147483647") && !from_shared.contains("sleep 2001"),
        "the pod's namespace sees the sandbox, not a container of its own: {from_shared:?}"
    );

    // What an exec starts in the background runs on in its container after the exec ends,
    // as with runc (`kubectl exec … -- sh -c 'daemon &'`); it used to be killed with the exec.
    for (id, n) in [(&own, 3001), (&shared, 3002)] {
        let (_, err, code) = pod.exec(id, &["sh", "-c", &format!("sleep {n} >/dev/null 2>&1 &")]);
        assert_eq!(code, 0, "{err}");
        let now = seen(&mut pod, id);
        assert!(
            now.contains(&format!("sleep {n}")),
            "the background sleep {n} is gone once its exec ended: {now:?}"
        );
    }
    // One left writing to the exec's output (every second, never idle for the drain's 2 s)
    // does not hold the exec open: its output is drained for 10 s at most.
    let start = std::time::Instant::now();
    let (_, err, code) = pod.exec(
        &own,
        &["sh", "-c", "while :; do echo busy; sleep 1; done &"],
    );
    assert_eq!(code, 0, "{err}");
    let took = start.elapsed();
    assert!(
        took < std::time::Duration::from_secs(30),
        "an exec whose leftover keeps writing ended after {took:?}"
    );
    // It ends with its container: removing `shared` ends the sleep its exec left in the
    // pod's namespace, which a container started after it would otherwise see.
    pod.cri.stop(&shared, 10).expect("StopContainer");
    pod.cri.remove(&shared).expect("RemoveContainer");
    pod.containers.retain(|c| *c != shared);
    let later = pod.container(
        "later",
        &["sleep", "2003"],
        vec![],
        pid_mode(NamespaceMode::Pod),
    );
    let from_later = seen(&mut pod, &later);
    assert!(
        from_later.contains("sleep 2147483647") && !from_later.contains("sleep 3002"),
        "what the removed container's exec left runs on: {from_later:?}"
    );
    pod.remove();
}

#[test]
fn a_host_pid_pod_is_in_the_pod_vms_own_pid_namespace() {
    cri_preflight!("a_host_pid_pod_is_in_the_pod_vms_own_pid_namespace");
    let mut pod = Pod::run("hostpid", |c| {
        let sc = c.linux.as_mut().and_then(|l| l.security_context.as_mut());
        if let Some(ns) = sc.and_then(|sc| sc.namespace_options.as_mut()) {
            ns.pid = NamespaceMode::Node.into();
        }
    });
    let one = pod.container(
        "one",
        &["sleep", "2003"],
        vec![],
        pid_mode(NamespaceMode::Node),
    );
    let two = pod.container(
        "two",
        &["sleep", "2004"],
        vec![],
        pid_mode(NamespaceMode::Node),
    );
    // The VM's: the agent is PID 1 and every container of the pod is seen.
    assert!(
        pid1(&mut pod, &one).contains("init"),
        "{}",
        pid1(&mut pod, &one)
    );
    let from_two = seen(&mut pod, &two);
    assert!(
        from_two.contains("sleep 2003") && from_two.contains("sleep 2147483647"),
        "hostPID sees the pod's containers: {from_two:?}"
    );
    pod.remove();
}

#[test]
fn a_container_killed_by_its_memory_limit_is_oom_killed() {
    cri_preflight!("a_container_killed_by_its_memory_limit_is_oom_killed");
    let mut pod = Pod::run("oom", |_| {});
    // A 64 MiB buffer under a 32 MiB limit.
    let hog = [
        "busybox",
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=64M",
        "count=1",
    ];
    let id = pod.started("hog", &hog, vec![], |linux| {
        linux.resources = Some(LinuxContainerResources {
            memory_limit_in_bytes: 32 << 20,
            ..Default::default()
        })
    });
    let status = pod.exited(&id);
    assert_eq!(
        (status.exit_code, status.reason.as_str()),
        (137, "OOMKilled"),
        "{status:?}"
    );
    // Killed otherwise, or ending by itself, it keeps its plain reason.
    // (Not PID 1 of a namespace of its own, which SIGKILL from inside cannot end.)
    let killed = pod.started("killed", &["sh", "-c", "kill -9 $$"], vec![], |linux| {
        let sc = linux.security_context.as_mut();
        if let Some(ns) = sc.and_then(|sc| sc.namespace_options.as_mut()) {
            ns.pid = NamespaceMode::Pod.into();
        }
    });
    let status = pod.exited(&killed);
    assert_eq!(
        (status.exit_code, status.reason.as_str()),
        (137, "Error"),
        "{status:?}"
    );
    let done = pod.started("done", &["sh", "-c", "exit 0"], vec![], |_| {});
    assert_eq!(pod.exited(&done).reason, "Completed");
    pod.remove();
}

#[test]
fn settings_the_guest_cannot_honour_are_refused_naming_the_field() {
    cri_preflight!("settings_the_guest_cannot_honour_are_refused_naming_the_field");
    let (cd, mut cri, handler) = start();
    let refused_pod = |cri: &mut Cri, name: &str, tweak: &dyn Fn(&mut PodSandboxConfig)| {
        let uid = format!("{name}-uid");
        let mut config = client::pod_config(name, &uid, &cd.pod_dir(&uid).join("logs"), false);
        tweak(&mut config);
        let err = cri
            .run_pod(&config, &handler)
            .expect_err("the pod was not refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert_eq!(cd.vm_pids(), Vec::<u32>::new(), "a VM booted for {name}");
        err.message().to_string()
    };
    let err = refused_pod(&mut cri, "swappy", &|c| {
        let linux = c.linux.as_mut().expect("linux config");
        linux.sysctls = [("vm.swappiness".to_string(), "10".to_string())].into();
    });
    assert!(
        err.contains("refused: linux.sysctl.vm.swappiness: not a namespaced sysctl"),
        "{err}"
    );
    let err = refused_pod(&mut cri, "hostipc", &|c| {
        let sc = c.linux.as_mut().and_then(|l| l.security_context.as_mut());
        if let Some(ns) = sc.and_then(|sc| sc.namespace_options.as_mut()) {
            ns.ipc = NamespaceMode::Node.into();
        }
    });
    assert!(
        err.contains("refused: linux.namespaces (ipc)") && err.contains("hostIPC"),
        "{err}"
    );

    // A container's seccomp notification: refused at its start, naming the rule.
    let (pod, pod_cfg, dir) = run_pod(&cd, &mut cri, &handler, "notify", |_| {});
    let profile = dir.join("notify.json");
    std::fs::write(
        &profile,
        r#"{"defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]}"#,
    )
    .expect("the profile");
    let mut config = container_config("notified", IMAGE, &["true"], vec![]);
    if let Some(sc) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
    {
        sc.seccomp = Some(SecurityProfile {
            profile_type: ProfileType::Localhost.into(),
            localhost_ref: profile.to_string_lossy().into_owned(),
        });
    }
    let id = cri
        .create(&pod, &config, &pod_cfg)
        .expect("CreateContainer");
    let err = cri
        .start(&id)
        .expect_err("a notify profile was not refused");
    assert!(
        err.message()
            .contains("refused: linux.seccomp.syscalls[0].action: SCMP_ACT_NOTIFY"),
        "{err:?}"
    );
    cri.remove(&id).expect("RemoveContainer");
    remove_pod_leaves_nothing(&cd, &mut cri, &pod, &[&id]);
}
